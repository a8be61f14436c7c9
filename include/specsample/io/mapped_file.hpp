#pragma once
/// @file mapped_file.hpp
/// A read-only POSIX memory map of a whole file (RAII, move-only).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace specsample::io {

/// A whole file mapped read-only into memory. The bytes stay valid (at the same address) for the
/// lifetime of the object, including across moves. An empty file maps to an empty span.
class mapped_file {
 public:
  mapped_file() = default;

  /// Maps `path` read-only. Throws `specsample::error` naming the file if it cannot be opened,
  /// is not a regular file, or cannot be mapped.
  [[nodiscard]] static mapped_file open(const std::filesystem::path& path) {
    mapped_file f;
    f.path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw error(fmt::format("{}: cannot open file: {}", path.string(), std::strerror(errno)));
    }
    struct ::stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw error(fmt::format("{}: cannot stat file: {}", path.string(), std::strerror(e)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw error(fmt::format("{}: not a regular file", path.string()));
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        throw error(fmt::format("{}: cannot map file ({} bytes): {}", path.string(), size,
                                std::strerror(e)));
      }
      f.data_ = static_cast<const std::byte*>(p);
      f.size_ = size;
    }
    ::close(fd);  // the mapping keeps its own reference to the file
    return f;
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~mapped_file() { unmap(); }

  /// The mapped bytes.
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The file size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The path the file was opened from.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) {
      ::munmap(const_cast<std::byte*>(data_), size_);
      data_ = nullptr;
      size_ = 0;
    }
  }

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace specsample::io

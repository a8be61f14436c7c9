# Finds the 8-bit PCRE2 library (Debian: libpcre2-dev) and defines the imported target
# PCRE2::8bit. Debian ships no CMake config for PCRE2, only pkg-config files.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_PCRE2 QUIET libpcre2-8)
endif()
find_path(PCRE2_INCLUDE_DIR NAMES pcre2.h HINTS ${PC_PCRE2_INCLUDE_DIRS})
find_library(PCRE2_LIBRARY NAMES pcre2-8 HINTS ${PC_PCRE2_LIBRARY_DIRS})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(PCRE2 REQUIRED_VARS PCRE2_LIBRARY PCRE2_INCLUDE_DIR)
if(PCRE2_FOUND AND NOT TARGET PCRE2::8bit)
  add_library(PCRE2::8bit UNKNOWN IMPORTED)
  set_target_properties(PCRE2::8bit PROPERTIES
    IMPORTED_LOCATION "${PCRE2_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "PCRE2_CODE_UNIT_WIDTH=8")
endif()
mark_as_advanced(PCRE2_INCLUDE_DIR PCRE2_LIBRARY)

# CMake toolchain file: Linux aarch64 with Debian's cross compiler
# (gcc-aarch64-linux-gnu) against a sysroot of Debian's arm64 -dev packages.
# scripts/test-arm64.sh makes the sysroot and configures with
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DTOKI_SYSROOT=/path/to/sysroot
# TOKI_SYSROOT may also come from the environment. Tests run under qemu-user
# (CMAKE_CROSSCOMPILING_EMULATOR), so `ctest` runs the aarch64 unit tests here.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

# A toolchain file is read again for every try_compile project, where only
# the variables listed in CMAKE_TRY_COMPILE_PLATFORM_VARIABLES are passed on:
# the environment is the fallback that always reaches it.
if(NOT TOKI_SYSROOT AND DEFINED ENV{TOKI_SYSROOT})
  set(TOKI_SYSROOT "$ENV{TOKI_SYSROOT}")
endif()
if(NOT TOKI_SYSROOT)
  message(FATAL_ERROR "aarch64-linux-gnu.cmake: set TOKI_SYSROOT (-DTOKI_SYSROOT=DIR or the environment) to the arm64 sysroot")
endif()
set(TOKI_SYSROOT "${TOKI_SYSROOT}" CACHE PATH "arm64 sysroot (Debian arm64 -dev packages unpacked)")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES TOKI_SYSROOT)
set(ENV{TOKI_SYSROOT} "${TOKI_SYSROOT}")

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_SYSROOT "${TOKI_SYSROOT}")
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Headers and libraries from the sysroot only; programs (python3, the
# compiler, pkg-config) from the host.
set(CMAKE_FIND_ROOT_PATH "${TOKI_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config: the sysroot's .pc files only (never the host's x86_64 ones),
# and their -I/-L paths prefixed with the sysroot.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${TOKI_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
  "${TOKI_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${TOKI_SYSROOT}/usr/lib/pkgconfig:${TOKI_SYSROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Test executables run under qemu-user; -L makes the sysroot the root for the
# dynamic loader (/lib/ld-linux-aarch64.so.1) and the libraries it opens.
find_program(TOKI_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(NOT TOKI_QEMU_AARCH64)
  message(FATAL_ERROR "aarch64-linux-gnu.cmake: qemu-aarch64 not found (Debian: qemu-user or qemu-user-static)")
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR "${TOKI_QEMU_AARCH64};-L;${TOKI_SYSROOT}")

# Cross toolchain for 64-bit ARM (aarch64) Linux with Debian's packages (docs/edge-arm64.md):
# crossbuild-essential-arm64 (aarch64-linux-gnu-gcc/g++ 12), the `:arm64` -dev packages installed
# side by side with the amd64 ones after `dpkg --add-architecture arm64` (multiarch), and
# qemu-user to run the result here. Used by the `arm64` preset (build-arm64/).
#
# Multiarch, not a sysroot: Debian's cross gcc is configured --with-sysroot=/ --enable-multiarch,
# so it already searches /usr/include/aarch64-linux-gnu and /usr/lib/aarch64-linux-gnu before the
# arch-independent /usr/include. The arm64 libraries live next to the amd64 ones, under
# /usr/lib/aarch64-linux-gnu; CMake looks only in lib/${CMAKE_LIBRARY_ARCHITECTURE} (never in
# lib/x86_64-linux-gnu) for libraries and arch-specific package configs, so the root path is "/"
# and the *_MODE_* settings below keep the usual cross semantics explicit.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Binutils of the same triplet (strip is used by scripts/build-arm64.sh; CMake finds ar/ranlib
# itself from the compiler's prefix, named here so a stray host ar is never picked).
set(CMAKE_AR aarch64-linux-gnu-ar CACHE FILEPATH "")
set(CMAKE_RANLIB aarch64-linux-gnu-ranlib CACHE FILEPATH "")
set(CMAKE_STRIP aarch64-linux-gnu-strip CACHE FILEPATH "")

set(CMAKE_FIND_ROOT_PATH /)
set(CMAKE_LIBRARY_PATH /usr/lib/aarch64-linux-gnu /lib/aarch64-linux-gnu)
set(CMAKE_INCLUDE_PATH /usr/include/aarch64-linux-gnu)
# Programs (flatc, pkg-config, qemu) run on the build machine: host ones. Libraries, headers and
# package configs must be the target's: only under the root path (and lib/aarch64-linux-gnu).
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (FindPkgConfig: cppzmq's FindZeroMQ, libsodium, ...) must read the arm64 .pc files.
# Debian 12 has no aarch64-linux-gnu-pkg-config wrapper, and the host pkg-config reads
# lib/x86_64-linux-gnu/pkgconfig, which would hand out amd64 libraries. PKG_CONFIG_LIBDIR replaces
# the default search path; pkg-config runs only at configure time, when this file is read.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# ctest (and catch_discover_tests at build time) run arm64 programs through qemu-user. `-L /`
# points qemu at the multiarch arm64 loader and libc (/lib/ld-linux-aarch64.so.1 and
# /lib/aarch64-linux-gnu): with the cross toolchain's own sysroot (/usr/aarch64-linux-gnu) a
# dynamically linked program hangs at its first thread start (checked on Debian 12).
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-aarch64;-L;/")

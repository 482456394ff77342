# Cross build for Linux ARM64 with Debian's gcc-aarch64-linux-gnu and the arm64 -dev
# packages of Debian multiarch (dpkg --add-architecture arm64; scripts/test-arm64.sh
# installs both). Use: cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Tests run under qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR), with the target's
# libraries found under /usr/aarch64-linux-gnu and the multiarch folders.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# Headers and libraries of the target come from the multiarch folders of this same root.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_FIND_ROOT_PATH / /usr/aarch64-linux-gnu)

# pkg-config answers for arm64: only the arm64 .pc files, none of the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Debian 12's libczmq-dev is not multiarch (installing the arm64 one removes the host's),
# so only the arm64 library (libczmq4:arm64) is installed and this .pc names it; the
# headers are the host's, which are the same for every architecture.
if(NOT EXISTS /usr/lib/aarch64-linux-gnu/pkgconfig/libczmq.pc
   AND EXISTS /usr/lib/aarch64-linux-gnu/libczmq.so.4)
  # The first reading (the build's own folder) names the place; later readings for
  # try_compile run in other folders of the same process and keep it.
  if(NOT DEFINED ENV{CAIRN_ARM64_PCDIR})
    set(ENV{CAIRN_ARM64_PCDIR} ${CMAKE_BINARY_DIR}/pkgconfig-arm64)
  endif()
  set(shim $ENV{CAIRN_ARM64_PCDIR})
  file(WRITE ${shim}/libczmq.pc "prefix=/usr
libdir=/usr/lib/aarch64-linux-gnu
includedir=/usr/include

Name: libczmq
Description: The high-level C binding for 0MQ (arm64 library, host headers)
Version: 4.2.1
Requires.private: libzmq
Libs: -L\${libdir} -l:libczmq.so.4
Cflags: -I\${includedir}
")
  set(ENV{PKG_CONFIG_LIBDIR} "${shim}:$ENV{PKG_CONFIG_LIBDIR}")
endif()

# qemu's -cpu max has asimd, dotprod, i8mm and fp16, so every kernel path runs in the tests.
# The sysroot (-L) is /: the arm64 C library of Debian multiarch (libc6:arm64) puts the
# target's loader at /lib/ld-linux-aarch64.so.1 and its libraries in
# /usr/lib/aarch64-linux-gnu, next to the -dev packages' libraries the build links.
find_program(CAIRN_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(CAIRN_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CAIRN_QEMU_AARCH64} -cpu max -L /)
endif()

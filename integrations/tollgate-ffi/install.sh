#!/usr/bin/env bash
# Builds the C library and installs it with its header and a pkg-config file:
#
#     bash integrations/tollgate-ffi/install.sh /usr/local      # or any prefix
#     cc app.c $(PKG_CONFIG_PATH=/usr/local/lib/pkgconfig pkg-config --cflags --libs tollgate)
#
# PROFILE=ci picks another cargo profile (the test suite's); the default is release.
set -euo pipefail
prefix="${1:?usage: install.sh PREFIX}"
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"   # absolute, for the .pc file
profile="${PROFILE:-release}"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
cargo build -q --profile "$profile" -p tollgate-ffi
target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
out="$profile"
[[ "$profile" == dev ]] && out=debug
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)"
# The shared library under its full version, with the links the loader and the linker look
# for: its SONAME (libtollgate_ffi.so.0.1 while the version is 0.1.x; see build.rs) and the
# plain name that -ltollgate_ffi finds.
IFS=. read -r major minor _ <<<"$version"
soname="libtollgate_ffi.so.$major"
[[ "$major" == 0 ]] && soname="libtollgate_ffi.so.0.$minor"
cp "$target/$out/libtollgate_ffi.so" "$prefix/lib/libtollgate_ffi.so.$version"
ln -sfn "libtollgate_ffi.so.$version" "$prefix/lib/$soname"
ln -sfn "libtollgate_ffi.so.$version" "$prefix/lib/libtollgate_ffi.so"
cp "$target/$out/libtollgate_ffi.a" "$prefix/lib/"
cp "$here/include/tollgate.h" "$prefix/include/"
cat >"$prefix/lib/pkgconfig/tollgate.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: tollgate
Description: Exact, lock-free rate limiters (tollgate's C ABI)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -ltollgate_ffi
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
PC
echo "installed tollgate $version in $prefix"

#!/bin/bash
# Carries into this (foreign-architecture) build image a cross compiler for the
# image's own architecture that runs on an x86_64 host: Debian's x86_64 packages
# of gcc/g++/binutils for the image's triplet, unpacked under $2 with their own
# loader and libraries, every program's interpreter and RPATH pointed there. The
# kernel of an x86_64 host runs those programs natively inside the emulated
# container (binfmt only intercepts the image's architecture), while everything
# else in it runs under QEMU. Its sysroot is the image's own root filesystem
# (the default "/" of Debian's cross gcc), and the target side (glibc, crt files,
# libgcc, libstdc++ and its headers) is the image's own, linked in from the
# native gcc's directories: the cross compiler builds against exactly what the
# image's native g++ would.
#
# $1: the list of x86_64 packages; $2: where to put them. On an x86_64 image
# (nothing to carry) it does nothing.
set -euo pipefail

packages_file=$1 prefix=$2
host=amd64
if [[ "$(dpkg --print-architecture)" == "$host" ]]; then
  exit 0
fi
triplet=$(gcc -dumpmachine)
version=$(gcc -dumpversion)
# The packages are named for the image's gcc: a mismatch must fail here.
mapfile -t packages < <(grep -v -e '^#' -e '^[[:space:]]*$' "$packages_file" \
  | sed -e "s/@TRIPLET@/$triplet/g" -e "s/@VERSION@/$version/g" -e "s/\$/:$host/")

dpkg --add-architecture "$host"
apt-get update -qq
work=$(mktemp -d)
(cd "$work" && apt-get download -qq "${packages[@]}")
mkdir -p "$prefix"
for deb in "$work"/*.deb; do
  dpkg-deb --extract "$deb" "$prefix"
done
rm -rf "$work" "$prefix/usr/share" "$prefix/usr/lib/x86_64-linux-gnu/gconv" /var/lib/apt/lists/*
dpkg --remove-architecture "$host"

loader=$prefix/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
libraries=$prefix/lib/x86_64-linux-gnu:$prefix/usr/lib/x86_64-linux-gnu
# DT_RPATH (not RUNPATH) also serves the libraries' own dependencies. Only the
# toolchain's programs: each patchelf runs under QEMU.
while IFS= read -r -d '' file; do
  if [[ "$file" != "$loader" ]] && patchelf --print-interpreter "$file" > /dev/null 2>&1; then
    patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$libraries" "$file"
  fi
done < <(find "$prefix/usr/bin" "$prefix/usr/lib/gcc-cross" -type f -print0)

# The target side, from the native gcc: what the cross gcc looks for in its own
# directories (crt*.o, libgcc, libstdc++.so, gcc's intrinsics headers) unless it
# ships it itself (its programs and LTO plugin), and the C++ headers.
cross_lib=$prefix/usr/lib/gcc-cross/$triplet/$version
native_lib=/usr/lib/gcc/$triplet/$version
for entry in "$native_lib"/*; do
  if [[ ! -e "$cross_lib/${entry##*/}" && ! -L "$cross_lib/${entry##*/}" ]]; then
    if [[ -f "$entry" && -x "$entry" && ! "$entry" =~ \.so ]]; then
      echo "$entry: a program the cross compiler does not carry" >&2
      exit 1
    fi
    ln -s "$entry" "$cross_lib/"
  fi
done
cxx_headers=$prefix/usr/$triplet/include/c++/$version
mkdir -p "$cxx_headers"
ln -s /usr/include/c++/"$version"/* "$cxx_headers/"
ln -s /usr/include/"$triplet"/c++/"$version" "$cxx_headers/$triplet"
mkdir -p "$prefix/bin"
ln -s "../usr/bin/$triplet-gcc-$version" "$prefix/bin/cc"
ln -s "../usr/bin/$triplet-g++-$version" "$prefix/bin/c++"

# Proof: the compiler proper and the assembler are x86_64 programs that run, and
# what they make runs here and links the image's own libstdc++.
for program in "$("$prefix/bin/c++" -print-prog-name=cc1plus)" "$("$prefix/bin/c++" -print-prog-name=as)"; do
  readelf --file-header "$(readlink -f "$program")" | grep -q 'Machine:.*X86-64' \
    || { echo "$program: not an x86_64 program of $prefix" >&2; exit 1; }
done
check=$(mktemp -d)
printf '#include <iostream>\nint main() { std::cout << "ok" << std::endl; }\n' > "$check/check.cpp"
"$prefix/bin/c++" -O2 -o "$check/check" "$check/check.cpp"
[[ "$("$check/check")" == ok ]]
rm -rf "$check"

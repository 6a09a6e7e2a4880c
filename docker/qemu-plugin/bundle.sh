#!/bin/bash
# Builds /opt/qemu-plugin (argument 1) inside the image: fetches the source of the
# installed qemu-user's exact version, compiles the plugins against its
# qemu-plugin.h, and gathers the emulators with their shared libraries.
set -euo pipefail

out=$1
src=$(dirname "$0")
version=$(dpkg-query -W -f='${source:Version}' qemu-user)
work=$(mktemp -d)
cd "$work"
apt-get source -qq --download-only "qemu=$version"
orig=(qemu_*.orig.tar.*)
debian=(qemu_*.debian.tar.*)
headers=(include/qemu/qemu-plugin.h tests/plugin/insn.c)
tar -xf "${debian[0]}"
# The files come from the upstream tarball: Debian's patches must not change them.
for file in "${headers[@]}"; do
  if grep -rqs -- "$file" debian/patches; then
    echo "a Debian patch of qemu $version changes $file: apply the patches first" >&2
    exit 1
  fi
done
tar -xf "${orig[0]}" --strip-components=1 --wildcards "${headers[@]/#/*/}"

mkdir -p "$out/bin" "$out/lib" "$out/plugins"
flags=(-O2 -shared -fPIC -Iinclude/qemu $(pkg-config --cflags --libs glib-2.0))
gcc -o "$out/plugins/libinsn.so" tests/plugin/insn.c "${flags[@]}"
gcc -Wall -Werror -o "$out/plugins/libinsn_regions.so" "$src/insn_regions.c" "${flags[@]}"
cp /usr/bin/qemu-aarch64 /usr/bin/qemu-x86_64 "$out/bin/"
# Every library the emulators and plugins load, and the loader that runs them
# where the container's own /lib is another architecture's.
ldd "$out"/bin/* "$out"/plugins/*.so | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | sort -u \
  | xargs -I{} cp -L {} "$out/lib/"
echo "$version" > "$out/VERSION"
"$out/lib/ld-linux-x86-64.so.2" --library-path "$out/lib" "$out/bin/qemu-aarch64" --version | head -1
cd / && rm -rf "$work"

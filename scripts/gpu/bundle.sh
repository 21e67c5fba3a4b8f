#!/usr/bin/env bash
# Packs binaries built on a development machine so they run on a GPU machine whose image
# lacks the project's C++ dependencies (fmt, PCRE2, cpp-httplib, OpenSSL, libgomp):
# copies each binary to DEST/ and every shared library it needs that is not part of the
# C runtime or the NVIDIA driver/toolkit to DEST/lib/, and writes DEST/run:
#
#   scripts/gpu/bundle.sh BUILD_DIR DEST BINARY...      e.g. build-cuda .devpack affinity-bench
#   DEST/run BINARY [args...]                           runs it with DEST/lib first on the path
#
# BUNDLE_XZ=1 stores the binaries xz-compressed (CUDA fat binaries shrink ~3x, which keeps a
# bundle under a transfer limit); DEST/run unpacks a binary on first use (xz, or Python's lzma).
#
# glibc, libstdc++, libgcc_s and CUDA's own libraries (libcuda, libcublas*, libcudart,
# libnccl) are left to the target machine, so its driver and toolkit are the ones used.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BUILD_DIR DEST BINARY..." >&2; exit 2; }
build=$1 dest=$2
shift 2
mkdir -p "$dest/lib"
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda|libcublas|libcudart|libnccl|libnvidia)'
for name in "$@"; do
    bin="$build/bin/$name"
    [ -x "$bin" ] || { echo "bundle: $bin not built" >&2; exit 1; }
    rm -f "$dest/$name" "$dest/$name.xz"
    cp -f "$bin" "$dest/"
    strip --strip-unneeded "$dest/$name" 2>/dev/null || true  # symbols are not needed to run; the carry limit is tight
    if [ "${BUNDLE_XZ:-0}" = 1 ]; then xz -6 -T2 -f "$dest/$name"; fi
    ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r lib path; do
        [[ $lib =~ $skip ]] && continue
        cp -fL "$path" "$dest/lib/$lib"
    done
done
cat > "$dest/run" <<'RUN'
#!/usr/bin/env bash
d=$(cd "$(dirname "$0")" && pwd)
bin=$1; shift
if [ ! -x "$d/$bin" ] && [ -f "$d/$bin.xz" ]; then
    if command -v xz >/dev/null; then xz -dkc "$d/$bin.xz" > "$d/$bin"
    else python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$d/$bin.xz" "$d/$bin"; fi
    chmod +x "$d/$bin"
fi
LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/$bin" "$@"
RUN
chmod +x "$dest/run"
echo "bundle: $(ls "$dest" | grep -vc '^lib$') files, $(du -sh "$dest" | cut -f1) in $dest"

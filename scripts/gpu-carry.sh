#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine that has no network
# and perhaps no build tools for toki (an NVIDIA machine with the CUDA driver,
# where the Vulkan loader may be missing) into .gpu-carry/, a folder of this
# repo that .git/info/exclude ignores, small enough to travel with the
# repository (the device machines take 64 MiB in all):
#
#   payload.tar.xz     llama-server from the Debian sid Vulkan prefix of
#                      scripts/provision-llama-server.sh --backend vulkan
#                      (ggml-vulkan, the Vulkan loader, every library under
#                      the prefix's own dynamic loader; not Mesa or LLVM:
#                      lavapipe stays here), the ggml CPU backends, and
#                      libGLdispatch, libX11 and libXext for NVIDIA's Vulkan
#                      driver; toki built from the committed HEAD with its
#                      libraries and this machine's dynamic loader
#   stories260K.gguf   the tests' real tiny model (../shared does not travel)
#   setup.sh           run there: unpacks to /tmp/gpu-carry (or $1), finds
#                      the NVIDIA Vulkan driver's manifest, writes the
#                      wrappers bin/llama-server and bin/toki, and lists the
#                      devices; fails, saying what it found, without one
#   COMMAND.txt        the one-line command for the device machine
#
#   scripts/gpu-carry.sh [--toki BIN] [--prefix DIR] [--out DIR]
#
# --toki: a toki binary to carry instead of building HEAD (it must run on the
# other machine with the libraries found here). --prefix: the Vulkan prefix
# (default ~/.cache/tokirecur/llama-server-vulkan/prefix). --out: the folder
# (default .gpu-carry).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
die() { echo "gpu-carry: $*" >&2; exit 1; }
toki_bin=""
prefix=${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur/llama-server-vulkan/prefix
out=.gpu-carry
while [ $# -gt 0 ]; do
	case "$1" in
	--toki) toki_bin=$(realpath "$2"); shift ;;
	--prefix) prefix=$2; shift ;;
	--out) out=$2; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1" ;;
	esac
	shift
done
L=$prefix/usr/lib/x86_64-linux-gnu
if [ ! -x "$prefix/usr/bin/llama-server" ] || [ ! -f "$L/ld-linux-x86-64.so.2" ]; then
	die "no Vulkan prefix at $prefix: run scripts/provision-llama-server.sh --backend vulkan"
fi
[ -f "$L/ggml/backends0/libggml-vulkan.so" ] || die "the prefix has no libggml-vulkan.so"
[ -f "$L/libvulkan.so.1" ] || die "the prefix has no Vulkan loader (libvulkan1)"
work=$(mktemp -d /tmp/gpu-carry-XXXXXX)
trap 'rm -rf "$work"' EXIT
stage=$work/stage
mkdir -p "$stage/lib" "$stage/cpu" "$stage/bin" "$stage/toki-lib"

# ---- llama-server: the libraries its loader resolves, copied flat ----
libpath="$L:$L/llama:$L/ggml"
resolve() { # $1: a binary or library -> the prefix paths it needs
	"$L/ld-linux-x86-64.so.2" --library-path "$libpath" --list "$1" |
		awk '$2 == "=>" && $3 ~ /^\// {print $3}'
}
{
	resolve "$prefix/usr/bin/llama-server"
	resolve "$L/ggml/backends0/libggml-vulkan.so"
	resolve "$L/ggml/backends0/libggml-cpu-x64.so"
	# NVIDIA's libGLX_nvidia.so.0 is linked against glibc's old split
	# libraries and X11; the ones the driver does not bring come from here.
	for n in libdl.so.2 libpthread.so.0 librt.so.1 libX11.so.6 libxcb.so.1 libXau.so.6 \
		libXdmcp.so.6 libbsd.so.0 libmd.so.0; do
		if [ -e "$L/$n" ]; then echo "$L/$n"; fi
	done
} | sort -u >"$work/libs"
grep -q '/libvulkan.so.1$' "$work/libs" || die "ggml-vulkan does not resolve libvulkan.so.1 in the prefix"
while read -r f; do
	case "$f" in "$prefix"/*) ;; *) die "$f is outside the prefix" ;; esac
	cp -L "$f" "$stage/lib/$(basename "$f")"
done <"$work/libs"
cp -L "$L/ld-linux-x86-64.so.2" "$stage/lib/"
# ggml looks for its GPU backends beside the executable, which under an
# explicit loader is the loader's folder: lib/.
cp -L "$L/ggml/backends0/libggml-vulkan.so" "$stage/lib/"
# The CPU variants stay out of lib/ (ggml would load every one it finds
# there); the wrapper names the best this CPU runs in GGML_BACKEND_PATH.
cp -L "$L"/ggml/backends0/libggml-cpu-*.so "$stage/cpu/"
cp -L "$prefix/usr/bin/llama-server" "$stage/bin/llama-server.real"
grep -m1 '^llama-server' "$prefix/../INFO" >"$stage/LLAMA_VERSION" 2>/dev/null || true

# libGLdispatch (libglvnd0) and libXext: NVIDIA's Vulkan driver needs them,
# and a CUDA image may have neither. Debian 12's, from apt.
debs=$work/debs
mkdir -p "$debs"
if (cd "$debs" && apt-get download libglvnd0 libxext6 >/dev/null 2>&1); then
	for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$debs/x"; done
	for n in libGLdispatch.so.0 libXext.so.6; do
		f=$(find "$debs/x" -name "$n" | head -n 1)
		if [ -n "$f" ]; then cp -L "$f" "$stage/lib/"; fi
	done
else
	echo "gpu-carry: warning: apt-get download libglvnd0 libxext6 failed; the machine must have them" >&2
fi

# ---- toki: HEAD, built apart from the working tree ----
if [ -z "$toki_bin" ]; then
	commit=$(git rev-parse --short HEAD)
	echo "gpu-carry: building toki at $commit ..." >&2
	mkdir -p "$work/src"
	git archive HEAD | tar -x -C "$work/src"
	cmake -S "$work/src" -B "$work/src/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build "$work/src/build" -j"$(nproc)" --target toki >/dev/null
	toki_bin=$work/src/build/toki
	echo "$commit" >"$stage/TOKI_COMMIT"
fi
host_loader=$(ldd "$toki_bin" | awk '$1 ~ /^\/.*ld-linux/ {print $1}')
[ -n "$host_loader" ] || die "no dynamic loader in ldd $toki_bin"
cp -L "$host_loader" "$stage/toki-lib/ld-linux-x86-64.so.2"
ldd "$toki_bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r f; do
	cp -L "$f" "$stage/toki-lib/"
done
if ldd "$toki_bin" | grep -q 'not found'; then die "toki has libraries not found here"; fi
cp -L "$toki_bin" "$stage/toki-lib/toki.real"
"$toki_bin" version >"$stage/TOKI_VERSION" 2>&1 || true

# ---- the folder ----
echo "gpu-carry: compressing ..." >&2
# Only this script's files are replaced, each whole (written aside, then
# renamed): others may keep files of their own in the folder, and a run may
# be reading it.
mkdir -p "$out"
tar -C "$stage" -cf - . | xz -T0 -9 >"$out/.payload.tar.xz.tmp"
mv -f "$out/.payload.tar.xz.tmp" "$out/payload.tar.xz"
model=$root/../shared/models/stories260K.gguf
if [ -f "$model" ]; then
	cmp -s "$model" "$out/stories260K.gguf" 2>/dev/null || {
		cp "$model" "$out/.stories260K.gguf.tmp"
		mv -f "$out/.stories260K.gguf.tmp" "$out/stories260K.gguf"
	}
else
	echo "gpu-carry: warning: no $model; the tests will generate a 1M model instead" >&2
fi

cat >"$out/.setup.sh.tmp" <<'SETUP'
#!/usr/bin/env bash
# Unpacks the GPU carry (scripts/gpu-carry.sh) to /tmp/gpu-carry (or $1) and
# writes bin/llama-server, the Debian sid llama-server with ggml-vulkan on
# NVIDIA's Vulkan driver, and bin/toki; then lists the devices. Exits non-zero,
# saying what it found, where there is no NVIDIA Vulkan driver or ggml-vulkan
# sees no GPU. TOKI_VK_ICD names another ICD manifest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-/tmp/gpu-carry}
rm -rf "$dest"
mkdir -p "$dest"
if command -v xz >/dev/null; then
	xz -dc "$here/payload.tar.xz" | tar -x -C "$dest"
else
	python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
		"$here/payload.tar.xz" "$dest"
fi
say() { echo "gpu-carry setup: $*" >&2; }

# The NVIDIA ICD manifest: the driver's own folder first (a container's
# /usr/local/nvidia), then the system's.
icd=${TOKI_VK_ICD:-}
if [ -z "$icd" ]; then
	for c in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd*.json \
		/usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json \
		/usr/local/share/vulkan/icd.d/nvidia_icd*.json; do
		[ -f "$c" ] && { icd=$c; break; }
	done
fi
if [ -z "$icd" ]; then
	say "no NVIDIA Vulkan ICD manifest (nvidia_icd*.json) found; what there is:"
	ls -la /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1 | head -20 >&2 || true
	find / -xdev -name 'nvidia_icd*.json' 2>/dev/null | head >&2 || true
	exit 3
fi
say "ICD manifest: $icd"
sed 's/^/  /' "$icd" >&2

# The driver library the manifest names, and its folder, which goes on the
# loader's path after the carried libraries (its own libnvidia-* are there).
drv=$(sed -n 's/.*"library_path"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$icd" | head -n 1)
drv_dir=""
case "$drv" in
/*) drv_dir=$(dirname "$drv") ;;
*)
	p=$(ldconfig -p 2>/dev/null | awk -v n="$drv" '$1 == n && /x86-64/ {print $NF; exit}')
	[ -n "$p" ] && drv_dir=$(dirname "$p")
	if [ -z "$drv_dir" ]; then
		for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /lib64; do
			[ -e "$d/$drv" ] && { drv_dir=$d; break; }
		done
	fi
	;;
esac
if [ -z "$drv_dir" ] || [ ! -e "$drv_dir/$(basename "$drv")" ]; then
	say "the manifest's driver $drv is not on this machine:"
	ldconfig -p 2>/dev/null | grep -i -E 'nvidia|vulkan' | head -20 >&2 || true
	exit 3
fi
# Headless (no X server), NVIDIA's GLX library loads but gives no
# vkCreateInstance ("Could not get 'vkCreateInstance' via
# 'vk_icdGetInstanceProcAddr'", seen on the H200 machine on 2026-12-04); its
# EGL library beside it serves Vulkan without a display. Unless
# TOKI_VK_ICD chose a manifest, one naming the EGL library is written.
if [ -z "${TOKI_VK_ICD:-}" ] && [ "$(basename "$drv")" = libGLX_nvidia.so.0 ] &&
	[ -e "$drv_dir/libEGL_nvidia.so.0" ]; then
	api=$(sed -n 's/.*"api_version"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$icd" | head -n 1)
	icd=$dest/nvidia_egl_icd.json
	printf '{"file_format_version": "1.0.1", "ICD": {"library_path": "%s", "api_version": "%s"}}\n' \
		"$drv_dir/libEGL_nvidia.so.0" "${api:-1.3.0}" >"$icd"
	drv=$drv_dir/libEGL_nvidia.so.0
	say "headless: using $drv through $icd"
fi
say "driver: $drv_dir/$(basename "$drv")"
extra=$drv_dir
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
	[ -d "$d" ] && [ "$d" != "$drv_dir" ] && extra=$extra:$d
done

# The CPU backend: the best variant this CPU's flags allow (as
# provision-llama-server.sh picks it); with -ngl 99 it does little.
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { local f; for f in "$@"; do case "$flags" in *" $f "*) ;; *) return 1 ;; esac; done; }
prefs=()
if has avx512f avx512cd avx512bw avx512dq avx512vl; then
	has avx512_vnni avx512vbmi avx512_bf16 amx_tile amx_int8 && prefs+=(sapphirerapids)
	has avx512_vnni avx512vbmi avx512_bf16 && prefs+=(zen4)
	has avx512_vnni avx512_bf16 && prefs+=(cooperlake)
	has avx512_vnni avx512vbmi && prefs+=(icelake)
	has avx512_vnni && prefs+=(cascadelake)
	prefs+=(skylakex)
fi
has avx2 fma f16c bmi2 && prefs+=(haswell)
has sse4_2 && prefs+=(sse42)
prefs+=(x64)
cpu=""
for v in "${prefs[@]}"; do
	[ -f "$dest/cpu/libggml-cpu-$v.so" ] && { cpu=$dest/cpu/libggml-cpu-$v.so; break; }
done

# The wrappers: absolute paths, so that a copy of them runs too (the
# benchmarks copy toki aside). The ICD is set, not defaulted: lavapipe or
# another manifest from the environment would not be the GPU.
cat >"$dest/bin/llama-server" <<EOF
#!/bin/sh
GGML_BACKEND_PATH="\${TOKI_GGML_BACKEND_PATH:-$cpu}"
VK_ICD_FILENAMES="$icd"
VK_DRIVER_FILES="$icd"
export GGML_BACKEND_PATH VK_ICD_FILENAMES VK_DRIVER_FILES
exec "$dest/lib/ld-linux-x86-64.so.2" --library-path "$dest/lib:$extra" "$dest/bin/llama-server.real" "\$@"
EOF
cat >"$dest/bin/toki" <<EOF
#!/bin/sh
exec "$dest/toki-lib/ld-linux-x86-64.so.2" --library-path "$dest/toki-lib" "$dest/toki-lib/toki.real" "\$@"
EOF
chmod 0755 "$dest/bin/llama-server" "$dest/bin/toki"
say "toki: $("$dest/bin/toki" version 2>&1 | head -n 1)"
say "llama-server: $(cat "$dest/LLAMA_VERSION" 2>/dev/null)"
devices=$("$dest/bin/llama-server" --list-devices 2>&1 || true)
printf '%s\n' "$devices"
if ! printf '%s\n' "$devices" | grep -q 'Vulkan0'; then
	say "ggml-vulkan sees no GPU; the Vulkan loader's view:"
	VK_LOADER_DEBUG=error,warn "$dest/bin/llama-server" --list-devices 2>&1 | tail -30 >&2 || true
	exit 4
fi
say "ready: TOKI_GPU_LLAMA_SERVER=$dest/bin/llama-server TOKI_BIN=$dest/bin/toki"
SETUP
chmod 0755 "$out/.setup.sh.tmp"
mv -f "$out/.setup.sh.tmp" "$out/setup.sh"

# The device command: set up, list the devices, the GPU check with the
# carried toki and model, results and logs back in $OUT. Each part of
# gpu-check.sh gets 270 s, so the whole stays inside one 600 s call.
cat >"$out/.COMMAND.txt.tmp" <<'CMD'
set -o pipefail; export PYTHONUNBUFFERED=1; nvidia-smi -L; bash .gpu-carry/setup.sh /tmp/gpu-carry 2>&1 | tee $OUT/setup.log || { ldconfig -p | grep -i -E 'nvidia|vulkan' >>$OUT/setup.log; exit 3; }; export TOKI_GPU_LLAMA_SERVER=/tmp/gpu-carry/bin/llama-server TOKI_BIN=/tmp/gpu-carry/bin/toki TOKI_TEST_MODEL=$PWD/.gpu-carry/stories260K.gguf TOKI_GPU_CHECK_TIMEOUT=270 TOKI_GPU_CONCURRENCY_JSON=$OUT/gpu-concurrency.json; bash scripts/gpu-check.sh 2>&1 | tee $OUT/gpu-check.log; rc=$?; tar -czf $OUT/logs.tar.gz -C ~/.cache/tokirecur/test --exclude='*.gguf' . 2>/dev/null; exit $rc
CMD
mv -f "$out/.COMMAND.txt.tmp" "$out/COMMAND.txt"

# Ignored through .git/info/exclude, not .gitignore: it is this checkout's
# business, not the project's.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$out/" "$exclude" 2>/dev/null || echo "/$out/" >>"$exclude"
git check-ignore -q "$out/setup.sh" || die "$out is not ignored by git"

size=$(du -sk "$out" | cut -f1)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -ck --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
du -sh "$out"/* >&2
echo "gpu-carry: $out: $((size / 1024)) MiB; with the working tree that travels ($((tree / 1024)) MiB): $(((size + tree) / 1024)) MiB of 64" >&2
[ $((size + tree)) -lt $((64 * 1024)) ] || die "too large to travel (64 MiB)"
echo "gpu-carry: on the device machine (carry: $out), run:" >&2
cat "$out/COMMAND.txt"

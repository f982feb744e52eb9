# Sourced, not run:  . scripts/macos-env.sh
#
# macOS with Homebrew: puts the keg-only formulae toki builds against on
# pkg-config's path for this shell. Homebrew leaves curl, libarchive and
# ncurses (and openssl@3 on older Homebrew) out of its prefix because macOS
# ships its own, so without this `cmake -S . -B build` finds no libarchive,
# or the system's libcurl and ncurses instead of Homebrew's. Each folder is
# `brew --prefix FORMULA`/lib/pkgconfig (the formula's opt/ link, which
# survives upgrades); it goes in front of PKG_CONFIG_PATH, once. Nothing is
# written anywhere: add the line to ~/.zprofile to keep it.
# scripts/install-deps.sh prints this; scripts/demo.sh sources it on macOS;
# elsewhere it does nothing. POSIX sh, so that zsh, bash 3.2 and sh can
# source it, under `set -eu` too.
if [ "$(uname -s)" = Darwin ]; then
	_toki_brew=$(command -v brew 2>/dev/null || true)
	for _toki_b in /opt/homebrew/bin/brew /usr/local/bin/brew; do
		if [ -z "$_toki_brew" ] && [ -x "$_toki_b" ]; then
			_toki_brew=$_toki_b
		fi
	done
	if [ -z "$_toki_brew" ]; then
		echo "macos-env: Homebrew not found (https://brew.sh); PKG_CONFIG_PATH left as it is" >&2
	else
		for _toki_f in openssl@3 ncurses libarchive curl; do
			_toki_d=$("$_toki_brew" --prefix "$_toki_f" 2>/dev/null || true)
			_toki_d=$_toki_d/lib/pkgconfig
			if [ -d "$_toki_d" ]; then
				case ":${PKG_CONFIG_PATH:-}:" in
				*":$_toki_d:"*) ;;
				*) PKG_CONFIG_PATH=$_toki_d${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} ;;
				esac
			fi
		done
		export PKG_CONFIG_PATH
	fi
	unset _toki_brew _toki_b _toki_f _toki_d
fi

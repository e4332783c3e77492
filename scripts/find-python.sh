#!/usr/bin/env bash
# Print the path of a CPython interpreter of the given minor version (default 3.13, the Lambda
# runtime's), looking where machines of this kind keep one:
#
#   1. `pythonX.Y` on PATH - only if it runs (pyenv's shim is on PATH but refuses a version
#      that is not selected);
#   2. pyenv's builds, `$(pyenv root)/versions/X.Y.*` (the newest patch release first);
#   3. Debian's package, /usr/bin/pythonX.Y (FIND_PYTHON_SYSTEM_DIR replaces /usr/bin: tests).
#
# Prints nothing and says in one sentence how to get one (exit 1) when none is found.
set -euo pipefail
minor="${1:-3.13}"

works() { # the interpreter runs and is of the asked minor version
	"$1" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$minor' else 1)" \
		>/dev/null 2>&1
}

candidates() {
	command -v "python$minor" 2>/dev/null || true
	local root=""
	if command -v pyenv >/dev/null 2>&1; then
		root=$(pyenv root 2>/dev/null || true)
	fi
	root="${root:-${PYENV_ROOT:-$HOME/.pyenv}}"
	if [ -d "$root/versions" ]; then
		find "$root/versions" -maxdepth 1 -name "$minor.*" -printf '%f\n' 2>/dev/null |
			grep -E "^$minor\.[0-9]+$" | sort -t. -k3,3nr |
			while read -r version; do echo "$root/versions/$version/bin/python$minor"; done
	fi
	echo "${FIND_PYTHON_SYSTEM_DIR:-/usr/bin}/python$minor"
}

while read -r candidate; do
	if [ -n "$candidate" ] && [ -x "$candidate" ] && works "$candidate"; then
		echo "$candidate"
		exit 0
	fi
done < <(candidates)

echo "No Python $minor found (not on PATH, not under \$(pyenv root)/versions, not" \
	"/usr/bin/python$minor): install one (\`pyenv install $minor\`, or Debian's" \
	"\`apt-get install python$minor-venv\` where the release has it) or name it with" \
	"PYTHON=/path/to/python$minor." >&2
exit 1

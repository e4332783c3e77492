#!/bin/sh
# mypy's cache kept beside pip's, for the next checkout (issue 49): `make typecheck` runs
# `scripts/mypy-cache.sh seed SHARED` before mypy and `scripts/mypy-cache.sh keep SHARED`
# after it passed. A fresh clone has no .mypy_cache, and a cold mypy spends ~35 CPU s on the
# libraries' stubs (boto3's, google-genai's, pydantic's) that did not change; with a warm one
# the four runs take ~2. mypy still decides what is fresh: a module whose source hash, options
# or mypy version differ from the cache's is checked again, whatever checkout wrote it.
# SHARED empty (MYPY_SHARED_CACHE= on make's command line): nothing is read or kept.
# seed: copy SHARED to .mypy_cache when this checkout has none. keep: replace SHARED with a
# copy of .mypy_cache, whole or not at all (two checkouts keeping at once: one copy wins).
set -eu
action=${1:?usage: mypy-cache.sh seed|keep SHARED}
shared=${2-}
[ -n "$shared" ] || exit 0
case $action in
seed)
	if [ ! -e .mypy_cache ] && [ -d "$shared" ]; then
		tmp=$(mktemp -d .mypy_cache.seed.XXXXXX) || exit 0
		if cp -R "$shared/." "$tmp/" 2>/dev/null; then
			mv -T "$tmp" .mypy_cache || rm -rf "$tmp"
		else
			rm -rf "$tmp"
		fi
	fi
	;;
keep)
	[ -d .mypy_cache ] || exit 0
	# Never fails the build: a cache that cannot be kept is only a slower next clone.
	mkdir -p "$(dirname "$shared")" 2>/dev/null || exit 0
	tmp=$(mktemp -d "$shared.new.XXXXXX" 2>/dev/null) || exit 0
	if ! cp -R .mypy_cache/. "$tmp/" 2>/dev/null; then
		rm -rf "$tmp"
		exit 0
	fi
	old="$shared.old.$$"
	if [ -d "$shared" ]; then mv -T "$shared" "$old" 2>/dev/null || true; fi
	mv -T "$tmp" "$shared" 2>/dev/null || rm -rf "$tmp"
	rm -rf "$old"
	;;
*)
	echo "usage: mypy-cache.sh seed|keep SHARED" >&2
	exit 2
	;;
esac

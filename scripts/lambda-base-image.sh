#!/usr/bin/env bash
# Make the Lambda Python base image that `sam local` builds its invoke image on available to the
# local Docker engine: public.ecr.aws/lambda/python:3.13-x86_64 (the tag SAM asks for a python3.13
# x86_64 function; also tagged :3.13).
#
#   1. the image is already there (the real one, or a current stand-in): nothing to do;
#   2. otherwise `docker pull` the real image (users with registry access get AWS's image);
#   3. otherwise build an offline stand-in: Debian trixie (debootstrap --variant=minbase) with
#      its CPython 3.13 and the pinned awslambdaric (requirements-rie.txt) as the runtime
#      interface client, `docker import`ed with Lambda's directory layout and environment.
#
# The stand-in is NOT Amazon Linux: it is Debian + CPython 3.13 + awslambdaric, and it has no
# boto3 of its own (our layer ships its pinned boto3 anyway). It carries the label
# org.gemini-opstate.standin-inputs = a hash of its inputs (this script, requirements-rie.txt,
# suite, architecture) and is rebuilt only when those change.
#
# Environment: OPSTATE_BASE_IMAGE_PULL=0 skips the pull attempt; OPSTATE_BASE_IMAGE_FORCE=1
# rebuilds the stand-in even when current. Needs: docker (engine answering), and for the stand-in
# debootstrap and a python3 with pip (any version: it only downloads wheels), run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

ARCH=x86_64
REPO=public.ecr.aws/lambda/python
PY_MINOR=3.13
IMAGE="$REPO:$PY_MINOR-$ARCH"
ALIAS="$REPO:$PY_MINOR"
# Debian 13: its python3 is CPython 3.13, the runtime's minor version.
SUITE=trixie
MIRROR="${OPSTATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
LABEL=org.gemini-opstate.standin-inputs
PULL_TIMEOUT_S=60

say() { echo "lambda-base-image: $*" >&2; }

inputs_hash() {
	{
		cat "$0" requirements-rie.txt
		echo "$SUITE $ARCH $PY_MINOR"
	} | sha256sum | cut -c1-16
}

# The label of a present image: "" when absent or unlabelled (the real image), else the hash.
image_state() {
	if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
		echo absent
		return
	fi
	local label
	label=$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$IMAGE" 2>/dev/null || true)
	if [ -z "$label" ] || [ "$label" = "<no value>" ]; then
		echo real
	else
		echo "standin:$label"
	fi
}

build_standin() {
	local hash="$1"
	case "$(uname -m)" in
	x86_64 | amd64) ;;
	*)
		say "the stand-in can only be built for $ARCH on an $ARCH host (this is $(uname -m))"
		exit 1
		;;
	esac
	command -v debootstrap >/dev/null || {
		say "debootstrap is missing (apt-get install -y debootstrap)"
		exit 1
	}
	local python="${PYTHON:-python3}"
	local root
	root=$(mktemp -d /tmp/lambda-base-image.XXXXXX)
	# shellcheck disable=SC2064
	trap "rm -rf '$root'" EXIT
	local start=$SECONDS
	say "building the offline stand-in for $IMAGE (Debian $SUITE + CPython $PY_MINOR + awslambdaric)"
	debootstrap --variant=minbase --include="python$PY_MINOR,ca-certificates" \
		"$SUITE" "$root/rootfs" "$MIRROR" >"$root/debootstrap.log" 2>&1 || {
		tail -n 30 "$root/debootstrap.log" >&2
		exit 1
	}
	local rootfs="$root/rootfs"
	# The runtime interface client, wheels for the image's CPython on x86_64 Linux.
	"$python" -m pip install --disable-pip-version-check --no-input --quiet \
		--target "$rootfs/var/runtime" --only-binary=:all: \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		--implementation cp --python-version "$PY_MINOR" -r requirements-rie.txt
	mkdir -p "$rootfs/var/task" "$rootfs/var/lang/bin" "$rootfs/opt"
	test -x "$rootfs/usr/bin/python$PY_MINOR" || {
		say "Debian $SUITE has no python$PY_MINOR"
		exit 1
	}
	ln -sf "/usr/bin/python$PY_MINOR" "$rootfs/var/lang/bin/python$PY_MINOR"
	ln -sf "python$PY_MINOR" "$rootfs/var/lang/bin/python3"
	ln -sf "python$PY_MINOR" "$rootfs/var/lang/bin/python"
	# aws-lambda-rie (added by SAM) starts /var/runtime/bootstrap; _HANDLER is set by SAM.
	cat >"$rootfs/var/runtime/bootstrap" <<EOF
#!/bin/sh
exec /var/lang/bin/python$PY_MINOR -m awslambdaric "\$_HANDLER"
EOF
	chmod 755 "$rootfs/var/runtime/bootstrap"
	# Smaller image: no apt lists, docs or caches.
	rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc \
		"$rootfs"/usr/share/man "$rootfs"/usr/share/locale "$rootfs"/usr/share/info
	local id
	id=$(tar -C "$rootfs" --numeric-owner -c . | docker import \
		--change "ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin" \
		--change "ENV LANG=C.UTF-8" \
		--change "ENV TZ=:UTC" \
		--change "ENV LAMBDA_TASK_ROOT=/var/task" \
		--change "ENV LAMBDA_RUNTIME_DIR=/var/runtime" \
		--change "ENV PYTHONPATH=/var/task:/opt/python/lib/python$PY_MINOR/site-packages:/opt/python:/var/runtime" \
		--change "LABEL $LABEL=$hash" \
		--change "WORKDIR /var/task" \
		--change 'CMD ["/var/runtime/bootstrap"]' \
		- "$IMAGE")
	docker tag "$IMAGE" "$ALIAS"
	say "built $IMAGE (${id#sha256:}) in $((SECONDS - start)) s"
}

main() {
	docker info >/dev/null 2>&1 || {
		say "no Docker engine answers (docker info failed)"
		exit 1
	}
	local hash state
	hash=$(inputs_hash)
	state=$(image_state)
	if [ "${OPSTATE_BASE_IMAGE_FORCE:-0}" != 1 ]; then
		case "$state" in
		real)
			say "$IMAGE present (AWS's image)"
			return 0
			;;
		"standin:$hash")
			say "$IMAGE present (the offline stand-in, current)"
			return 0
			;;
		esac
		if [ "${OPSTATE_BASE_IMAGE_PULL:-1}" != 0 ]; then
			if timeout "$PULL_TIMEOUT_S" docker pull --quiet "$IMAGE" >/dev/null 2>&1; then
				docker tag "$IMAGE" "$ALIAS"
				say "pulled $IMAGE (AWS's image)"
				return 0
			fi
			say "cannot pull $IMAGE: using the offline stand-in"
		fi
	fi
	build_standin "$hash"
}

main "$@"

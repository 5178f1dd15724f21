# Sourced by scripts/check-image and scripts/check-pod (not run): podman for the checks, with
# all its state (storage, containers, pods, volumes, networks, containers.conf) in one
# temporary directory removed at exit, the stand-in base image and the build of
# deploy/Dockerfile. Set `check` (the script's name, for messages) before sourcing it; run
# from the repository root.
#
#   podman_install [PACKAGE...]  podman, runc, debootstrap and these, from Debian, if missing
#   podman_configure             $work, podman's configuration in it, the clean-up at exit
#   podman_base                  the stand-in for python:3.11-slim-bookworm ($base)
#   podman_sidecar_image IMAGE   deploy/Dockerfile built as IMAGE; with
#                                PSYCH_CHECK_IMAGE_ARCHIVE set, loaded from that archive when
#                                it exists (another check built it), saved there otherwise
#
# No container registry is needed: the base is stood in for by a Debian bookworm root
# filesystem made with debootstrap, with Debian's Python 3.11 in a virtualenv first on PATH, as
# the official image has its own Python in /usr/local/bin. The base's root filesystem is cached
# as a tarball in $PSYCH_CHECK_IMAGE_CACHE (default /var/cache/psych-sidecar/check-image), keyed
# by the recipe that made it and rebuilt when older than a week (Debian's security updates);
# delete that directory to rebuild it now.

started=$SECONDS
step() { printf '\n== %s: %s (%d s)\n' "$check" "$*" "$((SECONDS - started))"; }
fail() {
    echo "$check: $*" >&2
    exit 1
}
trap 'echo "$check: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

base=docker.io/library/python:3.11-slim-bookworm
debian_mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache="${PSYCH_CHECK_IMAGE_CACHE:-/var/cache/psych-sidecar/check-image}"

podman_install() { # [PACKAGE...]
    local missing=()
    for command in podman runc debootstrap; do
        command -v "$command" >/dev/null || missing+=("$command")
    done
    for package in "$@"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    if ((${#missing[@]})); then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            podman runc debootstrap "$@"
    fi
    podman --version
    runc --version | head -n1
}

# Podman's own configuration, all under $work. The sandbox workarounds are here, not in
# deploy/:
# - default_ulimits: rootful podman raises a container's open files (nofile) and processes
#   (nproc) to its own defaults, which a sandboxed host refuses (EPERM: the container does not
#   start); open files get the host's hard limit, processes 32768 (what podman build uses;
#   this host refused 50000 under a hard limit of 96365);
# - runtime = "runc": crun refuses a host with hybrid cgroups (v1 controllers beside a v2 mount);
# - cgroupfs and file events: no systemd runs here.
# The build also mounts the host's CA bundle over the base's (below), for a host whose HTTPS
# goes through a proxy only that bundle trusts, and the stand-in base's pip is told to use
# the system bundle (/etc/pip.conf, in the base: pip's own bundle is certifi's); and the build
# uses the host's network, which needs no network set-up of podman's.
podman_configure() {
    ((EUID == 0)) || fail "needs root (rootful podman, debootstrap)"
    work="$(mktemp -d "/var/tmp/psych-$check.XXXXXX")"
    trap podman_clean_up EXIT
    local hard_nofile nproc
    hard_nofile="$(ulimit -Hn)"
    [[ "$hard_nofile" == unlimited ]] && hard_nofile=1048576
    nproc="$(ulimit -Hu)"
    [[ "$nproc" == unlimited ]] || ((nproc > 32768)) && nproc=32768
    mkdir -p "$work/storage" "$work/run" "$work/tmp" "$work/volumes" "$work/networks"
    cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$work/tmp"
volume_path = "$work/volumes"

[network]
network_config_dir = "$work/networks"
EOF
    cat >"$work/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
    cat >"$work/registries.conf" <<EOF
unqualified-search-registries = ["docker.io"]
EOF
    export CONTAINERS_CONF="$work/containers.conf"
    export CONTAINERS_STORAGE_CONF="$work/storage.conf"
    export CONTAINERS_REGISTRIES_CONF="$work/registries.conf"
    ca_bundle="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
    [[ -f "$ca_bundle" ]] || fail "no CA bundle at $ca_bundle (set SSL_CERT_FILE)"
}

# Everything podman made goes (pods, containers, volumes, images), then whatever it still has
# mounted under $work, then $work.
podman_clean_up() {
    local status=$?
    if [[ -f "$work/containers.conf" ]]; then
        podman pod rm --force --time 0 --all >/dev/null 2>&1 || true
        podman rm --force --time 0 --all >/dev/null 2>&1 || true
        podman volume rm --force --all >/dev/null 2>&1 || true
        podman rmi --force --all >/dev/null 2>&1 || true
    fi
    findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount -l 2>/dev/null || true
    rm -rf "$work"
    exit "$status"
}

# The stand-in base: Debian bookworm (minbase) with Python 3.11 and ca-certificates, a
# virtualenv with pip at /opt/python first on PATH (the official image's python and pip are in
# /usr/local/bin), and no documentation or apt lists, as in a slim image.
make_base_rootfs() { # target directory
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$1" "$debian_mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -n 30 "$work/debootstrap.log" >&2; return 1; }
    chroot "$1" /usr/bin/python3 -m venv /opt/python
    rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* \
        "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/debconf/*-old
}
base_env=(PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)

podman_base() {
    step "base: $base stood in for by debootstrap (bookworm, $debian_mirror)"
    local recipe_key tarball
    recipe_key="$( (declare -f make_base_rootfs; echo "${base_env[*]}") | sha256sum | cut -c1-16)"
    tarball="$cache/base-$recipe_key.tar"
    if [[ -f "$tarball" ]] && [[ -z "$(find "$tarball" -mtime +7)" ]]; then
        echo "cached: $tarball ($(du -h "$tarball" | cut -f1), made $(date -r "$tarball" -u '+%F %H:%M UTC'))"
    else
        mkdir -p "$cache"
        nice -n 10 bash -c "$(declare -f make_base_rootfs); debian_mirror=$debian_mirror work=$work make_base_rootfs $work/rootfs"
        # Written aside, then renamed: a run stopped half-way leaves no half tarball behind.
        tar -C "$work/rootfs" -cf "$tarball.$$" .
        mv "$tarball.$$" "$tarball"
        find "$cache" -maxdepth 1 -name 'base-*.tar' ! -name "base-$recipe_key.tar" -delete
        rm -rf "$work/rootfs"
        echo "made: $tarball ($(du -h "$tarball" | cut -f1))"
    fi
    local changes=()
    for variable in "${base_env[@]}"; do changes+=(--change "ENV $variable"); done
    podman import --quiet "${changes[@]}" --change 'CMD ["python3"]' "$tarball" localhost/stand-in-rootfs >/dev/null
    mkdir "$work/base"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$work/base/pip.conf"
    printf 'FROM localhost/stand-in-rootfs\nCOPY pip.conf /etc/pip.conf\n' >"$work/base/Containerfile"
    podman build --quiet --format docker --pull=never --tag "$base" "$work/base" >/dev/null
    podman run --rm --network none "$base" sh -c 'command -v python pip && python --version'
}

podman_sidecar_image() { # IMAGE
    local image="$1" archive="${PSYCH_CHECK_IMAGE_ARCHIVE:-}"
    if [[ -n "$archive" && -f "$archive" ]]; then
        step "image: loaded from $archive (built by an earlier check of this run)"
        podman load --quiet --input "$archive" >/dev/null
        podman image exists "$image" || fail "$archive does not hold $image"
        podman image exists "$base" || fail "$archive does not hold $base"
        return
    fi
    podman_base
    step "build: deploy/Dockerfile (Docker format, so HEALTHCHECK stays)"
    nice -n 10 podman build --format docker --pull=never --network host \
        --volume "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro" \
        --file deploy/Dockerfile --tag "$image" . >"$work/build.log" 2>&1 \
        || { tail -n 60 "$work/build.log" >&2; fail "podman build failed"; }
    grep -E 'STEP [0-9]|COMMIT' "$work/build.log" | cut -c1-120
    if [[ -n "$archive" ]]; then
        # The base too: check-image compares the image with it.
        podman save --quiet --format docker-archive --multi-image-archive \
            --output "$archive" "$image" "$base"
        echo "saved $image and its base to $archive ($(du -h "$archive" | cut -f1)) for the next check"
    fi
}

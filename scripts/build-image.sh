#!/usr/bin/env bash
# Builds the gateway's container image on this machine without any container registry: the
# release binary (stripped) on a root filesystem assembled from Debian packages, committed
# `FROM scratch` with podman (or buildah) from deploy/Containerfile.local.
#
#   scripts/build-image.sh        # progress on stderr; the image's name is the last line of stdout
#
# What goes into the root filesystem, and nothing else:
#   /usr/local/bin/mrtr-gateway   the release binary without its debug info (kept beside the
#                                 staging area as mrtr-gateway.debug, linked by .gnu_debuglink)
#   the ELF interpreter and every shared library the binary needs, transitively, taken from the
#   packages libc6 and libgcc-s1 (the script fails naming a library none of them provides)
#   /etc/ssl/certs/ca-certificates.crt   built from the ca-certificates package's Mozilla set
#   /etc/os-release, /var/lib/dpkg/status.d/*, /usr/share/doc/*/copyright   (base-files; what
#                                 image scanners read to know the distribution and packages)
#   /etc/passwd, /etc/group (root and nonroot 65532), /etc/nsswitch.conf (hosts: files dns)
# The packages come from this machine's apt sources (`apt-get download`, checked against the
# signed archive indexes), so the glibc in the image is the one the binary was linked against
# or a later point release of it; they are cached under the staging area.
#
# Environment:
#   MRTR_IMAGE         the image name (default localhost/mrtr-gateway:<Cargo version>)
#   CARGO_TARGET_DIR   cargo's target directory (default target/); the staging area is
#                      $CARGO_TARGET_DIR/image (rootfs, Debian package cache, debug file)
#   MRTR_IMAGE_TOOL    podman or buildah (default: podman if installed, else buildah)
# Needs: cargo, apt-get and dpkg-deb (Debian or Ubuntu), binutils (objcopy, readelf), and
# podman or buildah (scripts/test.sh installs them). Runs as root or with podman's rootless
# setup; building needs no container runtime (the Containerfile has no RUN).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
export LC_ALL=C

say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 1; }

PACKAGES=(libc6 libgcc-s1 ca-certificates base-files)
BIN=mrtr-gateway
NONROOT_UID=65532

for tool in cargo apt-get apt-cache dpkg-deb objcopy readelf flock; do
  command -v "$tool" >/dev/null || die "'$tool' is needed (see the comment at the top)"
done
tool="${MRTR_IMAGE_TOOL:-}"
if [ -z "$tool" ]; then
  if command -v podman >/dev/null; then tool=podman; else tool=buildah; fi
fi
command -v "$tool" >/dev/null || die "neither podman nor buildah is installed"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
[ -n "$version" ] || die "no version in Cargo.toml"
image="${MRTR_IMAGE:-localhost/mrtr-gateway:$version}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
# Layer and image timestamps from the commit, so that the same commit gives the same layer.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

target="${CARGO_TARGET_DIR:-$repo/target}"
stage="$target/image"
mkdir -p "$stage/debs"
# One build at a time per target directory (the staging area is rebuilt from scratch).
exec 8>"$stage/.lock"
flock 8

say "cargo build --release --locked --bin $BIN"
cargo build --release --locked --bin "$BIN" >&2
built="$target/release/$BIN"

rootfs="$stage/context/rootfs"
debroot="$stage/debroot"
rm -rf "$stage/context" "$debroot"
mkdir -p "$rootfs/usr/local/bin" "$debroot"

# ---- the binary, without debug info ------------------------------------------------------
# The symbol table stays, so a panic's backtrace still names functions; file and line come
# back with the separate debug file (`gdb`/`addr2line` find it through .gnu_debuglink).
objcopy --only-keep-debug "$built" "$stage/$BIN.debug"
objcopy --strip-debug --add-gnu-debuglink="$stage/$BIN.debug" "$built" "$rootfs/usr/local/bin/$BIN"
chmod 0755 "$rootfs/usr/local/bin/$BIN"
say "binary: $(stat -c %s "$built") bytes built, $(stat -c %s "$rootfs/usr/local/bin/$BIN") in the image"

# ---- Debian packages ---------------------------------------------------------------------
# The file apt would download for a package (its candidate version), from the local indexes.
deb_file() { apt-get download --print-uris "$1" 2>/dev/null | awk 'NR==1 {print $2}'; }
updated=
refresh_indexes() { # once, and only where allowed: missing or stale indexes
  [ -z "$updated" ] && [ "$(id -u)" = 0 ] || return 1
  updated=1
  say "apt-get update"
  apt-get update -qq >&2
}
fetch() { # package -> path of its .deb in the cache, in $fetched
  local file
  file="$(deb_file "$1")"
  if [ -z "$file" ] && refresh_indexes; then file="$(deb_file "$1")"; fi
  [ -n "$file" ] || die "apt knows no package '$1' (apt-get update as root first)"
  if [ ! -s "$stage/debs/$file" ]; then
    say "apt-get download $1 ($file)"
    if ! (cd "$stage/debs" && apt-get download -q "$1") >&2; then
      refresh_indexes || die "could not download $1 (apt-get update as root first?)"
      file="$(deb_file "$1")"
      (cd "$stage/debs" && apt-get download -q "$1") >&2 || die "could not download $1"
    fi
  fi
  fetched="$stage/debs/$file"
}

declare -A deb_of=()
add_package() {
  [ -n "${deb_of[$1]:-}" ] && return 0
  fetch "$1"
  deb_of[$1]="$fetched"
  dpkg-deb -x "${deb_of[$1]}" "$debroot"
  # A package whose doc directory is a symlink (libgcc-s1 -> gcc-12-base) keeps its copyright
  # in the package the link names.
  local doc="$debroot/usr/share/doc/$1"
  if [ -L "$doc" ]; then add_package "$(basename "$(readlink "$doc")")"; fi
}
for p in "${PACKAGES[@]}"; do add_package "$p"; done

# ---- the interpreter and the libraries, transitively -------------------------------------
declare -A copied=()
copy_path() { # path inside the packages (absolute) -> copied to the rootfs with its symlinks
  local rel="${1#/}"
  [ -n "${copied[$rel]:-}" ] && return 0
  copied[$rel]=1
  [ -e "$debroot/$rel" ] || [ -L "$debroot/$rel" ] || die "/$rel is in none of: ${!deb_of[*]}"
  mkdir -p "$rootfs/$(dirname "$rel")"
  cp -a "$debroot/$rel" "$rootfs/$rel"
  if [ -L "$debroot/$rel" ]; then
    local to
    to="$(readlink "$debroot/$rel")"
    case "$to" in
      /*) copy_path "$to" ;;
      *) copy_path "/$(dirname "$rel")/$to" ;;
    esac
  else
    copy_needed "$debroot/$rel"
  fi
}
find_soname() { # soname -> its path inside the packages, in the loader's default directories
  local d
  for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib/aarch64-linux-gnu \
           usr/lib/aarch64-linux-gnu lib64 lib usr/lib64 usr/lib; do
    if [ -e "$debroot/$d/$1" ]; then echo "/$d/$1"; return 0; fi
  done
  return 1
}
copy_needed() { # ELF file -> every library it names in DT_NEEDED, copied
  local lib path
  for lib in $(readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    path="$(find_soname "$lib")" \
      || die "$(basename "$1") needs $lib, which none of ${!deb_of[*]} provides: add its package to PACKAGES"
    copy_path "$path"
  done
}
interp="$(readelf -l "$built" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')"
[ -n "$interp" ] || die "$BIN has no ELF interpreter (a static binary needs no libraries: drop them here)"
copy_path "$interp"
copy_needed "$rootfs/usr/local/bin/$BIN"

# The newest glibc symbol version the binary uses must be in the image's glibc.
libc_version="$(dpkg-deb -f "${deb_of[libc6]}" Version | sed 's/-.*//')"
wants="$(readelf --version-info --wide "$built" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
if [ "$(printf '%s\n%s\n' "$wants" "$libc_version" | sort -V | tail -1)" != "$libc_version" ]; then
  die "$BIN needs glibc $wants but libc6 is $libc_version"
fi

# ---- CA certificates, identity, users ------------------------------------------------------
# What update-ca-certificates makes from the default selection (every Mozilla certificate),
# one PEM after another, in name order.
mkdir -p "$rootfs/etc/ssl/certs"
for crt in "$debroot"/usr/share/ca-certificates/mozilla/*.crt; do
  sed -e '$a\' "$crt"
done >"$rootfs/etc/ssl/certs/ca-certificates.crt"
certs="$(grep -c 'BEGIN CERTIFICATE' "$rootfs/etc/ssl/certs/ca-certificates.crt")"
[ "$certs" -gt 50 ] || die "only $certs CA certificates"

copy_path /usr/lib/os-release
copy_path /etc/os-release

mkdir -p "$rootfs/var/lib/dpkg/status.d" "$rootfs/usr/share/doc"
for p in "${!deb_of[@]}"; do
  dpkg-deb -f "${deb_of[$p]}" >"$rootfs/var/lib/dpkg/status.d/$p"
  doc="$debroot/usr/share/doc/$p"
  if [ -L "$doc" ]; then
    cp -a "$doc" "$rootfs/usr/share/doc/$p"
  elif [ -f "$doc/copyright" ]; then
    mkdir -p "$rootfs/usr/share/doc/$p"
    cp "$doc/copyright" "$rootfs/usr/share/doc/$p/copyright"
  fi
done

printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/nonexistent:/sbin/nologin\n' \
  "$NONROOT_UID" "$NONROOT_UID" >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:%s:\n' "$NONROOT_UID" >"$rootfs/etc/group"
# Kubernetes writes /etc/hosts; without this file glibc would ask DNS first.
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
# The configuration and key directories the defaults name: mount points, empty in the image.
mkdir -p "$rootfs/etc/mrtr-gateway/keys"
chmod -R u=rwX,go=rX "$rootfs"

# ---- the image -----------------------------------------------------------------------------
cp deploy/Containerfile.local "$stage/context/Containerfile"
say "$tool build $image ($(du -sb "$rootfs" | cut -f1) bytes of files, from ${!deb_of[*]})"
"$tool" build --file "$stage/context/Containerfile" --tag "$image" \
  --layers=false --timestamp "$epoch" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  "$stage/context" >&2
say "$image: $("$tool" image inspect --format '{{.Id}} {{.Size}} bytes' "$image" 2>/dev/null || true)"
echo "$image"

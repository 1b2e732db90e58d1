#!/usr/bin/env bash
# Idempotent eBPF toolchain setup (see README "Toolchain"). Run by `cargo xtask setup`.
#
# Result, under <repo>/.tools:
#   rust-web/usr   a rustc that can target bpfel-unknown-none (Debian's rustc-web, unpacked, with its
#                  prebuilt core for bpf) -- or a link to the user's nightly when it already has rust-src
#   bin/bpf-linker the BPF linker -- or a link to the one already on PATH
# and, system-wide, clang of the same LLVM major (the BTF tests compile C with `-target bpf`).
# A stamp file records what was installed so a second run does nothing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
stamp="$tools/.setup-ok"
BPF_LINKER_VERSION=0.13.0

log() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# clang of the LLVM major the unpacked rustc reports (a nightly's own LLVM is not checked: its user
# provides clang).
have_clang() {
  local v
  grep -q '^nightly' "$stamp" && return 0
  v=$("$tools/rust-web/usr/bin/rustc" -vV 2>/dev/null | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
  [[ -n "$v" ]] && { command -v "clang-$v" >/dev/null 2>&1 || [[ -x "/usr/lib/llvm-$v/bin/clang" ]]; }
}

ready=0
if [[ -f "$stamp" && -x "$tools/bin/bpf-linker" && -x "$tools/rust-web/usr/bin/rustc" ]]; then
  have_clang && exit 0
  ready=1 # only clang is missing: keep the toolchain that is there
fi
mkdir -p "$tools/bin"

# 1. Prefer what the user already has: a nightly with rust-src plus bpf-linker on PATH.
if [[ $ready -eq 0 ]] && command -v rustup >/dev/null 2>&1 && command -v bpf-linker >/dev/null 2>&1; then
  if sysroot=$(rustup run nightly rustc --print sysroot 2>/dev/null) \
      && [[ -d "$sysroot/lib/rustlib/src/rust/library" ]]; then
    log "using the existing nightly ($sysroot) with rust-src and $(command -v bpf-linker)"
    rm -rf "$tools/rust-web"; mkdir -p "$tools/rust-web"
    ln -sfn "$sysroot" "$tools/rust-web/usr"
    ln -sfn "$(command -v bpf-linker)" "$tools/bin/bpf-linker"
    command -v clang >/dev/null 2>&1 || log "no clang on PATH: the BTF tests (tests/btf) need one"
    echo "nightly $sysroot" >"$stamp"
    exit 0
  fi
fi

[[ $(id -u) -eq 0 ]] || die "first-time setup installs Debian packages and needs root (sudo cargo xtask setup)"
command -v apt-get >/dev/null || die "apt-get not found: install a nightly Rust with rust-src and bpf-linker instead"

# 2. Debian's rustc-web ships core/alloc prebuilt for bpfel-unknown-none: unpack, do not install
#    (installing it would conflict with rustup).
need_update=1
apt_update() { if [[ $need_update -eq 1 ]]; then apt-get update -qq; need_update=0; fi; }

# rustc-web links the system libLLVM.so.<major>; bpf-linker needs the same major's dev files.
llvm=
ensure_llvm() {
  local drv
  drv=$(find "$tools/rust-web/usr/lib" -maxdepth 2 -name 'librustc_driver-*.so' | head -n1)
  [[ -n "$drv" ]] || die "no librustc_driver in the unpacked rustc-web"
  llvm=$(patchelf --print-needed "$drv" | sed -n 's/^libLLVM\.so\.\([0-9]*\).*/\1/p' | head -n1)
  [[ -n "$llvm" ]] || die "cannot tell which LLVM the unpacked rustc links"
  if [[ ! -x "/usr/lib/llvm-$llvm/bin/llvm-config" ]]; then
    apt_update
    apt-get install -y -qq "llvm-$llvm-dev" >/dev/null || die "apt-get install llvm-$llvm-dev failed"
  fi
}

# The BTF tests (tests/btf) compile C to BPF objects with clang of the same LLVM major.
ensure_clang() {
  [[ -n "$llvm" ]] || ensure_llvm
  if ! command -v "clang-$llvm" >/dev/null 2>&1 && [[ ! -x "/usr/lib/llvm-$llvm/bin/clang" ]]; then
    apt_update
    log "installing clang-$llvm"
    apt-get install -y -qq "clang-$llvm" >/dev/null || die "apt-get install clang-$llvm failed"
  fi
}

if [[ ! -x "$tools/rust-web/usr/bin/rustc" ]] || ! "$tools/rust-web/usr/bin/rustc" -V >/dev/null 2>&1; then
  apt_update
  std=$(apt-cache depends libstd-rust-web-dev | awk '/Depends: libstd-rust-web-[0-9]/{print $2; exit}')
  [[ -n "$std" ]] || die "cannot find the versioned libstd-rust-web package in apt"
  dl=$(mktemp -d)
  (cd "$dl" && apt-get download -qq rustc-web cargo-web "$std" libstd-rust-web-dev \
      libstd-rust-web-dev-bpf libgit2-1.5 libhttp-parser2.9 libmbedcrypto7 libmbedtls14 libmbedx509-1) \
    || die "apt-get download of rustc-web failed"
  rm -rf "$tools/rust-web"; mkdir -p "$tools/rust-web"
  for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$tools/rust-web"; done
  rm -rf "$dl"
  command -v patchelf >/dev/null || { apt_update; apt-get install -y -qq patchelf >/dev/null; }
  for b in rustc rustdoc cargo; do
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib/x86_64-linux-gnu' "$tools/rust-web/usr/bin/$b"
  done
  ensure_llvm
  "$tools/rust-web/usr/bin/rustc" --print target-list | grep -qx bpfel-unknown-none \
    || die "unpacked rustc-web has no bpfel-unknown-none target"
  ls "$tools/rust-web/usr/lib/rustlib/bpfel-unknown-none/lib/"libcore-*.rlib >/dev/null 2>&1 \
    || die "unpacked rustc-web lacks the prebuilt core for bpfel (libstd-rust-web-dev-bpf)"
  log "unpacked $("$tools/rust-web/usr/bin/rustc" --version)"
fi

# 3. bpf-linker built against the same LLVM major as that rustc (derived, not hard-coded).
if [[ ! -x "$tools/bin/bpf-linker" ]]; then
  ensure_llvm
  log "building bpf-linker $BPF_LINKER_VERSION against LLVM $llvm (about a minute)"
  LLVM_PREFIX="/usr/lib/llvm-$llvm" cargo install --locked --quiet bpf-linker \
    --version "$BPF_LINKER_VERSION" --no-default-features --features "llvm-$llvm" --root "$tools" \
    || die "building bpf-linker failed"
fi

# 4. clang for the BTF tests.
ensure_clang

echo "rust-web $("$tools/rust-web/usr/bin/rustc" --version)" >"$stamp"
log "toolchain ready in $tools"

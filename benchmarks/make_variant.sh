#!/usr/bin/env bash
# On this machine, before a device call: make .dev_carry/variants/NAME for gpu_round11a.sh from a
# git commit or branch: NAME/files/PATH as REF has each PATH (kernels/, impls/, worker/, sample/ or tests/ only),
# NAME/SHA = REF's short commit. Send it with carry [".dev_carry"].
# Usage (repo root): bash benchmarks/make_variant.sh NAME REF PATH...
set -eu
name=${1:?name}; ref=${2:?git ref}; shift 2
[ $# -gt 0 ] || { echo "make_variant.sh: no paths"; exit 2; }
for path in "$@"; do
  case "$path" in kernels/* | impls/* | worker/* | sample/* | tests/*) ;; *) echo "make_variant.sh: $path is not under kernels/, impls/, worker/, sample/ or tests/"; exit 2 ;; esac
  git cat-file -e "$ref:$path" || { echo "make_variant.sh: $ref has no $path"; exit 2; }
done
dir=.dev_carry/variants/$name
rm -rf "$dir" && mkdir -p "$dir/files"
for path in "$@"; do
  mkdir -p "$dir/files/$(dirname "$path")"
  git show "$ref:$path" > "$dir/files/$path"
done
git rev-parse --short "$ref" > "$dir/SHA"
echo "$dir: $(cat "$dir/SHA"), $# file(s)"

#!/bin/sh
# Create the example pack repository deterministically: fixed author, committer
# and dates, so the commit ids named in release-1.json / release-2.json are
# reproduced exactly on every machine.
# Usage: sh examples/make-repo.sh TARGET_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
target=$1
rm -rf "$target"
mkdir -p "$target"
export GIT_AUTHOR_NAME="Catalog Ledger Examples" GIT_AUTHOR_EMAIL="examples@catalog-ledger.invalid"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
git -C "$target" init -q -b main
n=0
for release in release-1 release-2; do
  n=$((n + 1))
  cp -R "$here/content/$release/." "$target/"
  git -C "$target" add -A
  GIT_AUTHOR_DATE="1780000000 +0000" GIT_COMMITTER_DATE="178000000$n +0000" \
    git -C "$target" commit -q -m "$release"
  git -C "$target" rev-parse HEAD
done

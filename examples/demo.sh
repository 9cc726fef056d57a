#!/bin/sh
# The main job on the embedded SQLite default, in a scratch folder:
# build the example pack repository, apply release 1, apply release 2,
# re-apply release 2 (a no-op), show the status and a log excerpt, and end with
# the published catalog an audience is served: its revision and content digest.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="${DEMO_DIR:-$here/../demo-work}"
rm -rf "$work"
mkdir -p "$work/packs"
sh "$here/make-repo.sh" "$work/repos/catalog" >/dev/null
cp "$here/release-1.json" "$here/release-2.json" "$work/"
cp -R "$here/packs/devsample" "$work/packs/"
cd "$work"
echo "== catalog-ledger init"
catalog-ledger init
echo "== catalog-ledger apply release-1.json"
catalog-ledger apply release-1.json
echo "== catalog-ledger apply release-2.json"
catalog-ledger apply release-2.json
echo "== catalog-ledger apply release-2.json (again: nothing to do)"
catalog-ledger apply release-2.json
echo "== catalog-ledger status"
catalog-ledger status
echo "== catalog-ledger publish (nothing changed: no new revision)"
catalog-ledger publish
echo "== catalog-ledger log --from 1 --limit 5"
catalog-ledger log --from 1 --limit 5
echo "== catalog-ledger view integration:erp-sync (the published catalog an audience is served)"
catalog-ledger view integration:erp-sync

#!/bin/sh
# The main job on the embedded SQLite default, in a scratch folder.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="${DEMO_DIR:-$here/../demo-work}"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
catalog-ledger init
catalog-ledger log

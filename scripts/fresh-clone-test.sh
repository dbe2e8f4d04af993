#!/usr/bin/env bash
# fresh-clone-test.sh clones this repository's HEAD into a new temporary
# folder, with nothing beside it, and runs `make test` there (or the make
# targets given), as a new user would after `git clone`. It shows that the
# tests need nothing outside the repository. Uncommitted changes are not in
# the clone.
#   scripts/fresh-clone-test.sh                 make test
#   scripts/fresh-clone-test.sh vet test-race   other targets
#   KEEP=1 scripts/fresh-clone-test.sh          keep the clone afterwards
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(test)

tmp="$(mktemp -d "${TMPDIR:-/tmp}/jetsync-fresh-XXXXXX")"
if [ "${KEEP:-}" = 1 ]; then
	echo "fresh-clone-test: keeping $tmp"
else
	trap 'rm -rf "$tmp"' EXIT
fi
# Postgres refuses to run as root: when root, the test helpers run it as the
# postgres user, which needs to reach the clone's folders.
chmod 755 "$tmp"

git clone --quiet --no-hardlinks "$repo" "$tmp/jetsync"
cd "$tmp/jetsync"
echo "fresh-clone-test: $(git log --oneline -1) in $tmp/jetsync"
if [ "$(ls -A "$tmp")" != jetsync ]; then
	echo "fresh-clone-test: $tmp holds more than the clone" >&2
	exit 1
fi

start=$(date +%s)
status=0
make "${targets[@]}" || status=$?
echo "fresh-clone-test: make ${targets[*]} exited $status after $(( $(date +%s) - start ))s"
exit $status

# The shell tests' common start, sourced after `HL_USAGE=NAME`: the headlab binary from $1 ($HL),
# a temporary working directory removed at the end ($T), a Python with PyTorch's Debian path
# ($PY), and ok/bad counters that the test prints with its closing line.
set -u
HL=$(realpath "${1:?usage: $HL_USAGE path/to/headlab}")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; [ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/     /' "$2" | tail -5; }

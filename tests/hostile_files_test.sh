#!/usr/bin/env bash
# Outputs for the headlab command: what an output may replace (regular files only, never a run's
# snapshot), all-or-nothing directories on a full disk (a small tmpfs of our own, when root may
# mount one), and refused runs that leave nothing behind. Every command runs under `timeout`, in
# a temporary directory that is removed at the end. Device nodes are made here (mknod), never
# taken from /dev.
# Usage: hostile_files_test.sh path/to/headlab
set -u
HL=$(realpath "${1:?usage: hostile_files_test.sh path/to/headlab}")
T=$(mktemp -d)
MNT=""
cleanup() { [ -n "$MNT" ] && umount "$MNT" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
cd "$T" || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; [ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/     /' "$2" | tail -5; }
run() { timeout -k 3 "$1" "${@:2}" >"$T/out" 2>"$T/err"; rc=$?; }
# refused NAME REGEX cmd...: exit 1..123 with one "error:" line matching REGEX (case-insensitive)
refused() {
  local name=$1 re=$2; shift 2
  run 60 "$@"
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && grep -qiE -- "$re" "$T/err" && [ "$(grep -c 'error' "$T/err")" = 1 ]; then
    ok "$name (exit $rc)"
  else bad "$name: exit $rc, want one line matching /$re/" "$T/err"; fi
}

small="--d-model 16 --layers 1 --heads 2 --d-ff 32 --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1 --quiet"
run 60 "$HL" train $small --steps 4 --snapshot-every 2 --out "$T/run"
[ "$rc" = 0 ] || bad "fixture: train run with snapshots (exit $rc)" "$T/err"
M="$T/run/model.safetensors"

# ---- outputs are regular files: a device node, a FIFO, a symbolic link are never replaced -------
mknod "$T/dev" c 1 3 2>/dev/null || mkfifo "$T/dev"  # a character device of our own (/dev/null's numbers)
mkfifo "$T/fifo"
echo secret >"$T/secret"; ln -s "$T/secret" "$T/link"
for target in dev fifo link; do
  kind=$(stat -c %F "$T/$target")
  refused "convert --out $target ($kind): refused" "$target.*(not a regular file)" "$HL" convert "$M" --out "$T/$target"
  refused "view --out $target: refused" "$target.*not a regular file" "$HL" view "$T/run" --out "$T/$target"
  refused "grads --out $target: refused" "$target.*not a regular file" "$HL" grads --checkpoint "$M" --out "$T/$target"
  [ "$(stat -c %F "$T/$target")" = "$kind" ] && ok "$target is still a $kind" || bad "$target became a $(stat -c %F "$T/$target")"
done
[ "$(cat "$T/secret")" = secret ] && ok "the link's target is unchanged" || bad "the link's target was changed"

# ---- a run's snapshots are its own -------------------------------------------------------------
snap="$T/run/snapshots/step_00000002.safetensors"
cp "$snap" "$T/snap.bak"
refused "view --out a snapshot: refused" 'snapshots' "$HL" view "$T/run" --out "$snap"
refused "grads --out a snapshot: refused" 'snapshots' "$HL" grads --checkpoint "$M" --out "$snap"
refused "convert --out a snapshot: refused" 'snapshots' "$HL" convert "$M" --out "$snap"
refused "detect --out RUN/snapshots: refused" 'snapshots' "$HL" detect --checkpoint "$M" --examples 8 --out "$T/run/snapshots"
refused "edges --out RUN/snapshots/x: refused" 'snapshots' "$HL" edges --checkpoint "$M" --examples 8 --out "$T/run/snapshots/x"
cmp -s "$snap" "$T/snap.bak" && [ ! -e "$T/run/snapshots/x" ] && [ ! -e "$T/run/snapshots/.headlab-kind" ] \
  && ok "the snapshot is unchanged and nothing was added beside it" || bad "the snapshots directory changed: $(ls -A "$T/run/snapshots")"

# ---- a refused run leaves no directory ---------------------------------------------------------
run 60 "$HL" train --d-model 16 --layers 1 --heads 2 --d-ff 32 --task copy --length 4 --alphabet 7 --batch 8 --eval-size 16 \
  --threads 1 --quiet --steps 2 --init "$M" --out "$T/refused_init"
if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && [ ! -e "$T/refused_init" ]; then ok "refused train --init leaves no directory (exit $rc)"
else bad "refused train --init: exit $rc, left: $(ls -A "$T/refused_init" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi

# ---- export: a directory of its own, no link out of the source ---------------------------------
mkdir -p "$T/src" "$T/user"
cp "$M" "$T/src/model.safetensors"
echo '{"mine": 1}' >"$T/user/vocab.json"
refused "export --out a directory holding a user's vocab.json: refused" 'vocab\.json' "$HL" export "$T/src/model.safetensors" --out "$T/user"
[ "$(cat "$T/user/vocab.json")" = '{"mine": 1}' ] && [ "$(ls -A "$T/user")" = vocab.json ] \
  && ok "the user's vocab.json is unchanged, nothing added" || bad "export changed $T/user: $(ls -A "$T/user")"
ln -s "$T/secret" "$T/src/merges.txt"
refused "export with merges.txt linked out of the source: refused" 'merges\.txt.*(link|outside)' "$HL" export "$T/src/model.safetensors" --out "$T/exp1"
[ ! -e "$T/exp1" ] && ok "nothing exported with the link" || bad "export wrote $T/exp1: $(ls -A "$T/exp1")"
rm "$T/src/merges.txt"
run 60 "$HL" export "$T/src/model.safetensors" --out "$T/exp2"
[ "$rc" = 0 ] && [ -f "$T/exp2/config.json" ] && [ -f "$T/exp2/model.safetensors" ] && [ -z "$(ls -A "$T" | grep partial)" ] \
  && ok "export to a new directory: complete, no staging left" || bad "export to a new directory: exit $rc" "$T/err"

# ---- a Hugging Face hub-cache snapshot: its links into the repository's blobs are its own -------
# models--NAME/snapshots/REV/FILE -> ../../blobs/HASH, as huggingface_hub lays out ~/.cache/huggingface/hub
hub="$T/hub/models--tiny"; snap="$hub/snapshots/0123abc"
mkdir -p "$hub/blobs" "$snap"
printf '{"<|endoftext|>": 0, "a": 1}' >"$T/exp2/vocab.json"; printf '#version: 0.2\n' >"$T/exp2/merges.txt"
for f in config.json model.safetensors vocab.json merges.txt; do
  h=$(sha256sum "$T/exp2/$f" | cut -c1-40); cp "$T/exp2/$f" "$hub/blobs/$h"; ln -s "../../blobs/$h" "$snap/$f"
done
run 60 "$HL" export "$snap" --out "$T/exp_hub"
if [ "$rc" = 0 ] && cmp -s "$T/exp_hub/vocab.json" "$T/exp2/vocab.json" && cmp -s "$T/exp_hub/merges.txt" "$T/exp2/merges.txt" \
   && [ ! -L "$T/exp_hub/vocab.json" ]; then ok "export of a hub-cache snapshot (links into its blobs): exported, tokenizer copied"
else bad "export of a hub-cache snapshot: exit $rc" "$T/err"; fi
run 60 "$HL" attn --checkpoint "$snap" --tokens 1,1 --threads 1 --out "$T/attn_hub"
[ "$rc" = 0 ] && ok "--checkpoint a hub-cache snapshot: read" || bad "--checkpoint a hub-cache snapshot: exit $rc" "$T/err"
# still refused: a blob that is itself a link out, another repository's blobs, a snapshot-like
# directory outside a models-- repository
snap2="$hub/snapshots/evil"; mkdir -p "$snap2"; cp -P "$snap/config.json" "$snap/model.safetensors" "$snap2/"
ln -s "$T/secret" "$hub/blobs/evil"; ln -s ../../blobs/evil "$snap2/vocab.json"
refused "hub snapshot whose blob links out of the cache: refused" 'vocab\.json.*(link|outside)' "$HL" export "$snap2" --out "$T/exp_h2"
other="$T/hub/models--other/blobs"; mkdir -p "$other"; cp "$T/exp2/merges.txt" "$other/m"
rm "$snap2/vocab.json"; ln -s ../../../models--other/blobs/m "$snap2/merges.txt"
refused "hub snapshot linking another repository's blobs: refused" 'merges\.txt.*(link|outside)' "$HL" export "$snap2" --out "$T/exp_h3"
fake="$T/notcache/snapshots/r"; mkdir -p "$fake" "$T/notcache/blobs"; cp "$T/exp2/config.json" "$T/exp2/model.safetensors" "$fake/"
cp "$T/exp2/merges.txt" "$T/notcache/blobs/m"; ln -s ../../blobs/m "$fake/merges.txt"
refused "snapshots/ outside a models-- repository: its links out refused" 'merges\.txt.*(link|outside)' "$HL" export "$fake" --out "$T/exp_h4"
[ ! -e "$T/exp_h2" ] && [ ! -e "$T/exp_h3" ] && [ ! -e "$T/exp_h4" ] && ok "nothing exported from the refused snapshots" \
  || bad "a refused snapshot left an export"

# ---- a full disk: the directory appears complete or not at all --------------------------------
# fill NAME DIR FREE_KIB: leave about FREE_KIB KiB free on the tmpfs holding DIR
fill() { rm -f "$MNT/filler"; local avail; avail=$(df -k --output=avail "$MNT" | tail -1)
         [ "$avail" -gt "$2" ] && head -c $(( (avail - $2) * 1024 )) /dev/zero >"$MNT/filler" 2>/dev/null; }
kib() { echo $(( ($(stat -c %s "$1") + 4095) / 4096 * 4 )); }  # a file's size in whole 4 KiB pages
mkdir -p "$T/mnt"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=2m tmpfs "$T/mnt" 2>/dev/null; then
  MNT="$T/mnt"
  # export: room for model.safetensors alone (config.json does not fit)
  fill "$MNT" "$(kib "$T/exp2/model.safetensors")"
  run 60 "$HL" export "$T/src/model.safetensors" --out "$MNT/exp"
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && [ ! -e "$MNT/exp" ] && [ -z "$(ls -A "$MNT" | grep -v filler)" ]; then
    ok "export on a full disk: no directory (exit $rc)"
  else bad "export on a full disk: exit $rc, left: $(ls -A "$MNT" "$MNT/exp" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi
  grep -qi 'space' "$T/err" && ok "export on a full disk says so" || bad "export on a full disk: no word of the space" "$T/err"
  # edges: room for the mark and edges.json, not for the rest
  run 120 "$HL" edges --checkpoint "$M" --examples 8 --out "$T/edges_ref"
  [ "$rc" = 0 ] || bad "fixture: edges (exit $rc)" "$T/err"
  fill "$MNT" $(( $(kib "$T/edges_ref/.headlab-kind") + $(kib "$T/edges_ref/edges.json") ))
  run 120 "$HL" edges --checkpoint "$M" --examples 8 --out "$MNT/edges"
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && [ ! -e "$MNT/edges" ] && [ -z "$(ls -A "$MNT" | grep -v filler)" ]; then
    ok "edges on a full disk: no directory (exit $rc)"
  else bad "edges on a full disk: exit $rc, left: $(ls -A "$MNT" "$MNT/edges" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi
  # dla: room for its mark only
  fill "$MNT" 4
  run 60 "$HL" dla --checkpoint "$M" --examples 8 --out "$MNT/dla"
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && [ ! -e "$MNT/dla" ] && [ -z "$(ls -A "$MNT" | grep -v filler)" ]; then
    ok "dla on a full disk: no directory (exit $rc)"
  else bad "dla on a full disk: exit $rc, left: $(ls -A "$MNT" "$MNT/dla" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi
  # the other commands that write a directory: room for a few small files, not for all of theirs
  # (each run first with room, to learn its files, then with a page less than they take)
  run 60 "$HL" train $small --steps 4 --seed 3 --out "$T/run_b"; [ "$rc" = 0 ] || bad "fixture: a second run (exit $rc)" "$T/err"
  for cmd in compare match detect patch knockout; do
    case $cmd in
      compare) args=("$T/run" "$T/run_b" --examples 8) ;;
      match) args=(--checkpoint "$M" --checkpoint "$T/run_b/model.safetensors" --examples 8) ;;
      knockout) args=(--checkpoint "$M" --hook blocks.0.attn.hook_z --examples 8) ;;
      *) args=(--checkpoint "$M" --examples 8) ;;
    esac
    rm -rf "$T/ref_$cmd"; rm -f "$MNT/filler"
    run 120 "$HL" $cmd "${args[@]}" --threads 1 --out "$T/ref_$cmd"
    [ "$rc" = 0 ] || { bad "fixture: $cmd (exit $rc)" "$T/err"; continue; }
    need=0; for f in "$T/ref_$cmd"/* "$T/ref_$cmd"/.headlab-kind; do need=$((need + $(kib "$f"))); done
    fill "$MNT" $((need - 4))
    run 120 "$HL" $cmd "${args[@]}" --threads 1 --out "$MNT/$cmd"
    if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && [ ! -e "$MNT/$cmd" ] && [ -z "$(ls -A "$MNT" | grep -v filler)" ]; then
      ok "$cmd on a full disk ($((need - 4)) of its $need KiB free): no directory (exit $rc)"
    else bad "$cmd on a full disk: exit $rc, left: $(ls -A "$MNT" "$MNT/$cmd" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi
  done
  # train: snapshots that cannot fit are refused before the run, leaving no directory
  fill "$MNT" 64
  run 60 "$HL" train $small --steps 200 --snapshot-every 1 --out "$MNT/snaprun"
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && grep -q snapshot "$T/err" && [ ! -e "$MNT/snaprun" ]; then
    ok "train whose snapshots cannot fit: refused, no directory (exit $rc)"
  else bad "train whose snapshots cannot fit: exit $rc, left: $(ls -A "$MNT/snaprun" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi
  rm -f "$MNT/filler"
  run 120 "$HL" edges --checkpoint "$M" --examples 8 --out "$MNT/edges"
  [ "$rc" = 0 ] && [ -f "$MNT/edges/edges.csv" ] && [ -z "$(ls -A "$MNT" | grep partial)" ] \
    && ok "edges with room: complete, no staging left" || bad "edges with room: exit $rc" "$T/err"
  umount "$MNT"; MNT=""
else
  echo "skip the full-disk cases (mounting a tmpfs needs root)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

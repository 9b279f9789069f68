#!/usr/bin/env bash
# cli_prep_sources.sh — crew prep cifar10, images, csv, text, shards and arrays from the command line, on
# fixtures made here: the datasets they write train end to end with crew train (a tiny conv net
# on the CIFAR-shaped and image-folder datasets, a dense net on the CSV one, a tiny GPT on the
# shards), text becomes llm.c shards, a folder of llm.c shards a token dataset, and bad input
# gives exit status 2 with one line naming the file.
. "$(dirname "$0")/lib_cli.sh"

# ---------------------------------------------------------------- fixtures
# CIFAR-10-shaped batches: 6 files of 20 records (label byte, then 3072 planar pixel bytes).
cifar_batch() { # FILE [LABEL_OF_RECORD_7]
  for r in $(seq 0 19); do
    if [ "$r" -eq 7 ] && [ -n "${2:-}" ]; then printf "\\x$(printf %02x "$2")"; else printf "\\x0$((r % 10))"; fi
    seeded_bytes "$r" 3072
  done > "$1"
}
C="$TMP/cifar"; mkdir -p "$C"
for b in 1 2 3 4 5; do cifar_batch "$C/data_batch_$b.bin"; done
cifar_batch "$C/test_batch.bin"

# An image folder: cats (PNG, RGB and grey) and dogs (JPEG, RGB and grey), of different sizes.
png_rgb='iVBORw0KGgoAAAANSUhEUgAAAAoAAAAHCAIAAAC+zks0AAAAAXNSR0IArs4c6QAAAORJREFUCJkB2QAm/wAyV3yhxusQNVp/pMnu
EzhdgqfM8RY7YIWqz/QZPmMAiK3S9xxBZouw1fofRGmOs9j9IkdskbbbACVKb5S5AN4DKE1yl7zhBitQdZq/5AkuU3idwucMMVZ7
oMXqDwA0WX6jyO0SN1yBpsvwFTpfhKnO8xg9Yoes0fYbQGUAiq/U+R5DaI2y1/whRmuQtdr/JEluk7jdAidMcZa7AOAFKk90mb7j
CC1Sd5zB5gswVXqfxOkOM1h9osfsEQA2W4Clyu8UOV6DqM3yFzxhhqvQ9Ro/ZImu0/gdQmdmk2jCBnPjKwAAAABJRU5ErkJggg=='
png_grey='iVBORw0KGgoAAAANSUhEUgAAAAUAAAAFCAAAAACoBHk5AAAAAXNSR0IArs4c6QAAACdJREFUCJljSFn3w6mH4ZpC1pZ/zHfj4uLu
Mexi8ZvxiEGn7ABXCADSdQ0JmDLpLwAAAABJRU5ErkJggg=='
jpg_rgb='/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19i
Z2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj
Y2NjY2NjY2P/wAARCAAJAAwDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUF
BAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVW
V1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi
4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAEC
AxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVm
Z2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq
8vP09fb3+Pn6/9oADAMBAAIRAxEAPwAuX3uAeQxyc85H6+v/AI93z+8fHDbGJWnjiZ3G7LsDx7fOP6855zmobj70/wBG/wDQpq2b
P7jf8A/9FrXLiqzpUouIK8aas9/0P//Z'
jpg_grey='/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19i
Z2hnPk1xeXBkeFxlZ2P/wAALCAAIAAgBAREA/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUF
BAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVW
V1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi
4+Tl5ufo6erx8vP09fb3+Pn6/9oACAEBAAA/AE3ffhS39THGB9FBKAf7wDx+7e1f/9k='
I="$TMP/images"; mkdir -p "$I/dogs" "$I/cats"
for k in 1 2; do
  echo "$png_rgb" | base64 -d > "$I/cats/rgb$k.png"; echo "$png_grey" | base64 -d > "$I/cats/grey$k.PNG"
  echo "$jpg_rgb" | base64 -d > "$I/dogs/rgb$k.jpg"; echo "$jpg_grey" | base64 -d > "$I/dogs/grey$k.jpeg"
done
echo "skipped: not an image extension" > "$I/dogs/notes.txt"

# A 3-feature CSV, and a conv net for 32x32x3 images and a dense net for 3 features.
{ echo "x1,x2,label,x3"; for i in $(seq 0 39); do echo "$i,$((i * 2)),$((i % 4)),$((i % 7))"; done; } > "$TMP/t.csv"
cat > "$TMP/conv.json" <<'JSON'
{"input_shape": [32, 32, 3], "layers": [
  {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
  {"type": "global_avg_pool2d"},
  {"type": "dense", "units": 10}]}
JSON
cat > "$TMP/dense.json" <<'JSON'
{"input_shape": [3], "layers": [{"type": "dense", "units": 8, "activation": "relu"}, {"type": "dense", "units": 4}]}
JSON

train() { # MODEL DATA RUN
  "$CREW" train "$1" --data "$2" --max-steps 3 --devices cpu:1 --batch-per-device 4 --quiet --run-dir "$3" \
      > "$TMP/train.out" 2> "$TMP/train.err"
  local rc=$?
  [ $rc -eq 0 ] && [ -f "$3/weights.safetensors" ] && ok || fail "crew train $1 on $2 exited $rc: $(head -c 300 "$TMP/train.err")"
}

# ---------------------------------------------------------------- cifar10
"$CREW" prep cifar10 --src "$C" --out "$TMP/cifar-out" > "$TMP/out" 2>&1 || fail "prep cifar10: $(cat "$TMP/out")"
grep -q "100 training and 20 test samples, 10 classes" "$TMP/out" && ok || fail "prep cifar10 said: $(cat "$TMP/out")"
grep -q '"airplane"' "$TMP/cifar-out/manifest.json" && ok || fail "cifar10 class names"
train "$TMP/conv.json" "$TMP/cifar-out" "$TMP/run-cifar"

cp -r "$C" "$TMP/cifar-trunc"; head -c 50000 "$C/data_batch_2.bin" > "$TMP/cifar-trunc/data_batch_2.bin"
expect_exit 2 "data_batch_2.bin: 50000 bytes is not a positive multiple of the 3073-byte record" -- \
  "$CREW" prep cifar10 --src "$TMP/cifar-trunc" --out "$TMP/cifar-bad"
[ ! -e "$TMP/cifar-bad" ] && ok || fail "a failed prep left $TMP/cifar-bad behind"
cp -r "$C" "$TMP/cifar-label"; cifar_batch "$TMP/cifar-label/data_batch_4.bin" 10
expect_exit 2 "data_batch_4.bin: record 7 has label 10" -- "$CREW" prep cifar10 --src "$TMP/cifar-label" --out "$TMP/cifar-bad"
cp -r "$C" "$TMP/cifar-missing"; rm "$TMP/cifar-missing/test_batch.bin"
expect_exit 2 "test_batch.bin" -- "$CREW" prep cifar10 --src "$TMP/cifar-missing" --out "$TMP/cifar-bad"
expect_exit 2 "cifar10 needs --src" -- "$CREW" prep cifar10 --out "$TMP/cifar-bad"
expect_exit 2 "already exists" -- "$CREW" prep cifar10 --src "$C" --out "$TMP/cifar-out"

# ---------------------------------------------------------------- images
"$CREW" prep images --src "$I" --size 32x32 --test-fraction 0.25 --seed 3 --out "$TMP/img-out" > "$TMP/out" 2>&1 \
  || fail "prep images: $(cat "$TMP/out")"
grep -q "6 training and 2 test samples, 2 classes" "$TMP/out" && ok || fail "prep images said: $(cat "$TMP/out")"
tr -d ' \t\n' < "$TMP/img-out/manifest.json" | grep -q '"class_names":\["cats","dogs"\]' && ok || fail "images class names"
train "$TMP/conv.json" "$TMP/img-out" "$TMP/run-img"
"$CREW" prep images --src "$I" --size 9 --channels 1 --test-fraction 0.25 --out "$TMP/img-grey" > /dev/null 2>&1 || fail "prep images --channels 1"
tr -d ' \t\n' < "$TMP/img-grey/manifest.json" | grep -q '"sample_shape":\[9,9,1\]' && ok || fail "images --size 9 --channels 1"

mkdir -p "$TMP/img-bad"; cp -r "$I/cats" "$I/dogs" "$TMP/img-bad/"
: > "$TMP/img-bad/cats/empty.png"
expect_exit 2 "cats/empty.png: empty file" -- "$CREW" prep images --src "$TMP/img-bad" --size 8x8 --out "$TMP/img-x"
rm "$TMP/img-bad/cats/empty.png"; head -c 100 "$I/cats/rgb1.png" > "$TMP/img-bad/cats/cut.png"
expect_exit 2 "cats/cut.png: corrupt PNG" -- "$CREW" prep images --src "$TMP/img-bad" --size 8x8 --out "$TMP/img-x"
rm "$TMP/img-bad/cats/cut.png"; head -c 400 "$I/dogs/rgb1.jpg" > "$TMP/img-bad/dogs/cut.jpg"
expect_exit 2 "dogs/cut.jpg: corrupt JPEG" -- "$CREW" prep images --src "$TMP/img-bad" --size 8x8 --out "$TMP/img-x"
rm "$TMP/img-bad/dogs/cut.jpg"; mkdir "$TMP/img-bad/birds"
expect_exit 2 "birds: an empty class folder" -- "$CREW" prep images --src "$TMP/img-bad" --size 8x8 --out "$TMP/img-x"
[ ! -e "$TMP/img-x" ] && ok || fail "a failed prep left $TMP/img-x behind"
expect_exit 2 "needs --size" -- "$CREW" prep images --src "$I" --out "$TMP/img-x"
expect_exit 2 "--size" -- "$CREW" prep images --src "$I" --size 0x8 --out "$TMP/img-x"
expect_exit 2 "--channels takes 1 or 3" -- "$CREW" prep images --src "$I" --size 8 --channels 2 --out "$TMP/img-x"
expect_exit 2 "--test-fraction" -- "$CREW" prep images --src "$I" --size 8 --test-fraction 1 --out "$TMP/img-x"
expect_exit 2 "--label does not apply to images" -- "$CREW" prep images --src "$I" --size 8 --label y --out "$TMP/img-x"

# ---------------------------------------------------------------- csv
"$CREW" prep csv "$TMP/t.csv" --label label --test-fraction 0.2 --out "$TMP/csv-out" > "$TMP/out" 2>&1 \
  || fail "prep csv: $(cat "$TMP/out")"
grep -q "32 training and 8 test samples, 4 classes" "$TMP/out" && ok || fail "prep csv said: $(cat "$TMP/out")"
train "$TMP/dense.json" "$TMP/csv-out" "$TMP/run-csv"
printf 'a,b,y\n1,2,0\n3,1\n' > "$TMP/ragged.csv"
expect_exit 2 "ragged.csv: line 3 has 2 fields but the header has 3" -- "$CREW" prep csv "$TMP/ragged.csv" --label y --out "$TMP/csv-x"
printf 'a,b,y\n1,2,0\n3,x4,1\n' > "$TMP/word.csv"
expect_exit 2 "word.csv: line 3, column 2 ('b'): 'x4' is not a number" -- "$CREW" prep csv "$TMP/word.csv" --label y --out "$TMP/csv-x"
expect_exit 2 "no column named 'z'" -- "$CREW" prep csv "$TMP/t.csv" --label z --out "$TMP/csv-x"
expect_exit 2 "csv needs --label" -- "$CREW" prep csv "$TMP/t.csv" --out "$TMP/csv-x"
expect_exit 2 "csv needs a FILE" -- "$CREW" prep csv --label y --out "$TMP/csv-x"
[ ! -e "$TMP/csv-x" ] && ok || fail "a failed prep left $TMP/csv-x behind"

# ---------------------------------------------------------------- text
seeded_bytes 3000 3000 > "$TMP/corpus.bin"
"$CREW" prep text "$TMP/corpus.bin" --seq-len 32 --out "$TMP/text-out" > "$TMP/out" 2>&1 || fail "prep text: $(cat "$TMP/out")"
# llm.c's header: magic, version, token count as int32; then the bytes widened to uint16.
[ "$(od -An -t d4 -N 12 "$TMP/text-out/train_000000.bin" | tr -s ' ')" = " 20240520 1 2700" ] && ok || fail "train shard header"
[ "$(od -An -t d4 -N 12 "$TMP/text-out/val_000000.bin" | tr -s ' ')" = " 20240520 1 300" ] && ok || fail "val shard header"
[ "$(od -An -t u2 -j 1024 -v "$TMP/text-out/train_000000.bin" | tr -s ' \n' '  ')" = \
  "$(head -c 2700 "$TMP/corpus.bin" | od -An -t u1 -v | tr -s ' \n' '  ')" ] && ok || fail "train tokens differ from the bytes"
tr -d ' \t\n' < "$TMP/text-out/manifest.json" | grep -q '"vocab":256,"seq_len":32' && ok || fail "text manifest: $(cat "$TMP/text-out/manifest.json")"
expect_exit 2 "fewer than seq_len + 1" -- "$CREW" prep text "$TMP/corpus.bin" --seq-len 1000 --out "$TMP/text-x"
expect_exit 2 "is a token dataset" -- "$CREW" train "$TMP/dense.json" --data "$TMP/text-out"
: > "$TMP/empty.txt"
expect_exit 2 "empty.txt: empty file" -- "$CREW" prep text "$TMP/empty.txt" --out "$TMP/text-x"

# ---------------------------------------------------------------- shards
# A folder as llm.c's data scripts leave it (the shards crew prep text wrote above, renamed as
# fineweb.py names them, plus files that are not shards), prepared and trained on with a tiny GPT.
L="$TMP/llmc"; mkdir -p "$L"
cp "$TMP/text-out/val_000000.bin" "$L/tiny_val_000000.bin"
cp "$TMP/text-out/train_000000.bin" "$L/tiny_train_000001.bin"
echo "not a shard" > "$L/README.md"
"$CREW" prep shards "$L" --vocab 256 --seq-len 32 --out "$TMP/shards-out" > "$TMP/out" 2>&1 || fail "prep shards: $(cat "$TMP/out")"
grep -q "prepared $TMP/shards-out: 3000 tokens (vocab 256) in 2 shards (1 train, 1 val)" "$TMP/out" && ok \
  || fail "prep shards said: $(cat "$TMP/out")"
cmp -s "$L/tiny_train_000001.bin" "$TMP/shards-out/train_000000.bin" && cmp -s "$L/tiny_val_000000.bin" "$TMP/shards-out/val_000000.bin" \
  && ok || fail "prep shards: the shards differ from the sources"
tr -d ' \t\n' < "$TMP/shards-out/manifest.json" | grep -q '"name":"llmc".*"vocab":256,"seq_len":32' && ok \
  || fail "shards manifest: $(cat "$TMP/shards-out/manifest.json")"
cat > "$TMP/gpt.json" <<'JSON'
{"layers": [{"type": "gpt", "layers": 1, "heads": 2, "width": 16, "context": 32, "vocab": 256}]}
JSON
train "$TMP/gpt.json" "$TMP/shards-out" "$TMP/run-shards"
"$CREW" prep shards "$L" --seq-len 32 --out "$TMP/shards-gpt2" > "$TMP/out" 2>&1 && grep -q "(vocab 50257)" "$TMP/out" && ok \
  || fail "prep shards at GPT-2's defaults: $(cat "$TMP/out")"
expect_exit 2 "no val shard holds seq_len + 1 = 1001 tokens" -- "$CREW" prep shards "$L" --seq-len 1000 --out "$TMP/shards-x"
expect_exit 2 "tiny_train_000001.bin: token" -- "$CREW" prep shards "$L" --vocab 2 --out "$TMP/shards-x"
head -c 2000 "$TMP/text-out/train_000000.bin" > "$L/tiny_train_000002.bin"
expect_exit 2 "tiny_train_000002.bin: header says 2700 tokens" -- "$CREW" prep shards "$L" --out "$TMP/shards-x"
[ ! -e "$TMP/shards-x" ] && ok || fail "a failed prep shards left $TMP/shards-x behind"
expect_exit 2 "no llm.c train shards" -- "$CREW" prep shards "$TMP/img-out" --out "$TMP/shards-x"
expect_exit 2 "shards needs a DIR" -- "$CREW" prep shards --out "$TMP/shards-x"
expect_exit 2 "--vocab" -- "$CREW" prep shards "$L" --vocab 70000 --out "$TMP/shards-x"
expect_exit 2 "--test-fraction does not apply to shards" -- "$CREW" prep shards "$L" --test-fraction 0.1 --out "$TMP/shards-x"
expect_exit 2 "--vocab does not apply to text" -- "$CREW" prep text "$TMP/corpus.bin" --vocab 256 --out "$TMP/shards-x"
[ ! -e "$TMP/shards-x" ] && ok || fail "a failed prep shards left $TMP/shards-x behind"

# ---------------------------------------------------------------- arrays
# npy FILE DESCR SHAPE < DATA: a NumPy .npy file (version 1.0, header padded to 64 bytes).
npy() {
  local h="{'descr': '$2', 'fortran_order': False, 'shape': $3, }" pad len
  pad=$(( (64 - (10 + ${#h} + 1) % 64) % 64 ))
  h="$h$(printf '%*s' "$pad" '')"
  len=$(( ${#h} + 1 ))
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((len & 255)))\\x$(printf %02x $((len >> 8)))"
    printf '%s\n' "$h"; cat; } > "$1"
}
labels64() { for i in $(seq 0 $(($1 - 1))); do printf "\\x0$((i % 4))\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; done; }
seeded_bytes 120 120 | npy "$TMP/ax.npy" '|u1' '(40, 3)'
labels64 40 | npy "$TMP/ay.npy" '<i8' '(40,)'
seeded_bytes 30 30 | npy "$TMP/atx.npy" '|u1' '(10, 3)'
labels64 10 | npy "$TMP/aty.npy" '<i8' '(10,)'
"$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay.npy" --test-fraction 0.2 --seed 1 --out "$TMP/arr-out" > "$TMP/out" 2>&1 \
  || fail "prep arrays: $(cat "$TMP/out")"
grep -q "32 training and 8 test samples, 4 classes" "$TMP/out" && ok || fail "prep arrays said: $(cat "$TMP/out")"
tr -d ' \t\n' < "$TMP/arr-out/manifest.json" | grep -q '"scale":1,"mean":\[0\],"std":\[1\]' && ok \
  || fail "prep arrays normalises nothing: $(cat "$TMP/arr-out/manifest.json")"
train "$TMP/dense.json" "$TMP/arr-out" "$TMP/run-arr"
"$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay.npy" --test-x "$TMP/atx.npy" --test-y "$TMP/aty.npy" --out "$TMP/arr-test" \
  > "$TMP/out" 2>&1 && grep -q "40 training and 10 test samples, 4 classes" "$TMP/out" && ok \
  || fail "prep arrays --test-x: $(cat "$TMP/out")"
cmp -s <(tail -c 120 "$TMP/arr-test/train_x.npy") <(tail -c 120 "$TMP/ax.npy") && ok || fail "prep arrays changed the samples"
"$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay.npy" --out "$TMP/arr-train" > "$TMP/out" 2>&1 \
  && grep -q "40 training and 0 test samples" "$TMP/out" && ok || fail "prep arrays, train only: $(cat "$TMP/out")"
labels64 39 | npy "$TMP/ay-short.npy" '<i8' '(39,)'
expect_exit 2 "ay-short.npy: the labels must be one array of 40 values" -- \
  "$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay-short.npy" --out "$TMP/arr-x"
{ labels64 39; printf '\xff\xff\xff\xff\xff\xff\xff\xff'; } | npy "$TMP/ay-neg.npy" '<i8' '(40,)'
expect_exit 2 "ay-neg.npy: label -1 of sample 39 is not a class index" -- \
  "$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay-neg.npy" --out "$TMP/arr-x"
seeded_bytes 240 240 | npy "$TMP/ax16.npy" '<f2' '(40, 3)'
expect_exit 2 "ax16.npy" -- "$CREW" prep arrays "$TMP/ax16.npy" "$TMP/ay.npy" --out "$TMP/arr-x"
seeded_bytes 31 30 | npy "$TMP/atx4.npy" '|u1' '(15, 2)'
labels64 15 | npy "$TMP/aty4.npy" '<i8' '(15,)'
expect_exit 2 "must have the training ones' shape and dtypes" -- \
  "$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay.npy" --test-x "$TMP/atx4.npy" --test-y "$TMP/aty4.npy" --out "$TMP/arr-x"
expect_exit 2 "give both --test-x and --test-y" -- "$CREW" prep arrays "$TMP/ax.npy" "$TMP/ay.npy" --test-x "$TMP/atx.npy" --out "$TMP/arr-x"
expect_exit 2 "arrays needs X.npy and Y.npy files" -- "$CREW" prep arrays "$TMP/ax.npy" --out "$TMP/arr-x"
[ ! -e "$TMP/arr-x" ] && ok || fail "a failed prep arrays left $TMP/arr-x behind"

# ---------------------------------------------------------------- usage
expect_exit 2 "unknown source 'tiff'" -- "$CREW" prep tiff --out "$TMP/x"
"$CREW" prep --help > "$TMP/help"
for s in cifar10 images csv text arrays; do grep -q "crew prep $s" "$TMP/help" && ok || fail "crew prep --help lacks $s"; done
grep -q "crew prep shards" "$TMP/help" && ok || fail "crew prep --help lacks shards"
report

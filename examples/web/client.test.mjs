/**
 * client.mjs against docs/package-format.md's rules, with no package, model or npm install: a fake `ort` (a Tensor
 * that keeps what it is given), a fake session (records its feeds, answers what a test says) and a fake
 * SentencePieceProcessor (one piece per code point; zero-width characters give none). Each test names its rule.
 *
 *   node --test examples/web/client.test.mjs      (run by tests/serve/test_client_mjs.py)
 */
import {test} from "node:test";
import assert from "node:assert/strict";
import {checkManifest, openPackage, parseJson, predict, sessionOptions, tokenize, PackageError} from "./client.mjs";

const OLD = (v) => `manifest.json: schema_version ${v} is not supported by this client (it reads 4); rebuild the ` +
  "package with an edgekit that writes schema_version 4";
const SCHEMA_2 = OLD(2);

// --- a package in memory -------------------------------------------------------------------------------------

/** A protobuf message from [field, value] pairs: a number is a varint, {f32: x} a fixed32, a string or byte array
 * length-delimited. */
function proto(fields) {
  const varint = (n) => {
    const out = [];
    do { const b = n % 128; n = Math.floor(n / 128); out.push(n ? b | 128 : b); } while (n);
    return out;
  };
  return fields.flatMap(([field, value]) => {
    if (typeof value === "number") return [...varint(field * 8), ...varint(value)];
    if (value.f32 !== undefined) {
      return [...varint(field * 8 + 5), ...new Uint8Array(Float32Array.of(value.f32).buffer)];
    }
    const bytes = typeof value === "string" ? [...new TextEncoder().encode(value)] : [...value];
    return [...varint(field * 8 + 2), ...varint(bytes.length), ...bytes];
  });
}

const PIECES = [["<pad>", 3], ["<unk>", 2], ["[CLS]", 3], ["[SEP]", 3], ["▁play", 1], ["▁queen", null]];

/** tokenizer.model bytes: `pieces` as [text or null, type or null] (null: the field left out), then normalizers. */
function modelProto(pieces = PIECES, normalizers = ["edgekit_bert_basic"]) {
  const piece = ([text, type]) => proto([...(text === null ? [] : [[1, text]]), [2, {f32: -1.5}],
    ...(type ? [[3, type]] : [])]);
  return Uint8Array.from(proto([...pieces.map((p) => [1, piece(p)]), [2, proto([[1, 0]])],
    ...normalizers.map((name) => [3, proto([[1, name], [2, "\u0001\u0002"]])])]));
}

/** A schema 4 manifest: phone (T = 8, I = 3 intents, S = 5 tags) unless `server`. */
function manifest({T = 8, I = 3, S = 5, server = false} = {}) {
  const B = server ? ["batch"] : [1];
  const file = {sha256: "0".repeat(64), bytes: 1};
  return {
    schema_version: 4, schema: "manifest.schema.json", created_by: "edgekit 0.4.0", task: "intent",
    profile: server ? "server-cpu" : "web", max_len: T,
    tokenizer: {type: "sentencepiece", file: "tokenizer.model", normalizer: "edgekit_bert_basic", lowercase: true,
      vocab_size: PIECES.length, special_ids: {pad: 0, unk: 1, cls: 2, sep: 3}},
    labels: "labels.json", label_sets: {intents: I, slot_tags: S},
    inputs: [{name: "input_ids", dtype: "int64", shape: [...B, T]},
      {name: "attention_mask", dtype: "int64", shape: [...B, T]},
      {name: "word_pos", dtype: "int64", shape: [...B, T - 2]},
      {name: "intent_mask", dtype: "int32", shape: server ? ["batch", I] : [I]},
      {name: "reject", dtype: "int32", shape: B}],
    outputs: ["intent", "confidence", ...(S > 0 ? ["tags", "path_confidence"] : [])],
    decoding: {policy: "threshold", score: "confidence", threshold: 0.5, temperature: 1.0, oos_id: I,
      allowed_intents: null, oos_answer: "oos"},
    models: {onnx: "model.onnx"}, primary_runtime: "onnx",
    files: {"manifest.schema.json": file, "labels.json": file, "tokenizer.model": file, "model.onnx": file},
  };
}

const LABELS = {intents: ["a", "b", "c"], slot_tags: ["O", "B-x", "I-x", "B-y", "I-y"], oos_label: null};

const ZERO_WIDTH = new Set(["\u200b", "\u200d", "\ufeff"]);

/** "play" and "queen" are one piece each (ids 4, 5); "§" gives [1], as a model without byte fallback gives
 * `<unk>` (R7); any other word one piece (id 4) per code point, none for a zero-width one. */
class FakeSentencePiece {
  async loadFromB64StringModel(b64) { this.bytes = Buffer.from(b64, "base64"); }
  encodeIds(word) {
    const known = {play: [4], queen: [5], "§": [1]};
    if (Object.hasOwn(known, word)) return known[word];
    return Array.from(word).filter((c) => !ZERO_WIDTH.has(c)).map(() => 4);
  }
}

const ort = {Tensor: class { constructor(type, data, dims) { Object.assign(this, {type, data, dims}); } }};

/** A session that records its feeds and answers intent `k`, confidence 0.75, path_confidence 0.5 and the tag ids
 * `tags` (padded with
 * 99, which no test's words may read; without `tags`, 0 everywhere), or what `reply(feeds)` returns. */
function session(m, {k = 0, tags = null, reply = null} = {}) {
  const T = m.max_len;
  return {
    inputNames: m.inputs.map((i) => i.name), outputNames: [...m.outputs], calls: [],
    async run(feeds) {
      this.calls.push(feeds);
      if (reply) return reply(feeds);
      const tagData = BigInt64Array.from({length: T}, (_, w) => BigInt(tags === null ? 0 : tags[w] ?? 99));
      return {intent: {type: "int64", data: BigInt64Array.of(BigInt(k))},
        confidence: {type: "float32", data: Float32Array.of(0.75)},
        ...(m.outputs.includes("tags") ? {tags: {type: "int64", data: tagData},
          path_confidence: {type: "float32", data: Float32Array.of(0.5)}} : {})};
    },
  };
}

function open({m = manifest(), labels = LABELS, bytes = modelProto(), ...answers} = {}) {
  return openPackage({manifest: m, labels, tokenizerBytes: bytes, ort, session: session(m, answers),
    SentencePieceProcessor: FakeSentencePiece});
}

const refused = (pattern) => (err) => err instanceof PackageError && pattern.test(err.message);

test("a good package opens and answers", async () => {
  const pkg = await open({k: 1, tags: [1, 2]});
  const answer = await predict(pkg, "play queen");
  assert.deepEqual(answer, {intent: "b", confidence: 0.75, tags: ["B-x", "I-x"], path_confidence: 0.5,
    slots: [{slot: "x", value: "play queen", start: 0, end: 10}]});
  assert.equal(pkg.sp.bytes.length, modelProto().length);  // the tokenizer got tokenizer.model's bytes
});

// --- R2 ---------------------------------------------------------------------------------------------------------

test("R2: a schema 2 package is refused with the spec's line, before any other field is read", () => {
  assert.throws(() => checkManifest({...manifest(), schema_version: 2}), {message: SCHEMA_2});
  assert.throws(() => checkManifest({schema_version: 2}), {message: SCHEMA_2});  // nothing else read
  // a schema 2 manifest as edgekit wrote it: bool masks
  const old = manifest();
  old.schema_version = 2;
  old.inputs[3].dtype = old.inputs[4].dtype = "bool";
  assert.throws(() => checkManifest(old), (err) => err instanceof PackageError && err.message === SCHEMA_2);
});

test("R2: a schema 3 package (no path_confidence) is refused with the spec's line", () => {
  const m = manifest();
  m.schema_version = 3;
  m.outputs = ["intent", "confidence", "tags"];
  assert.throws(() => checkManifest(m), {message: OLD(3)});
});

test("R2: any other schema_version is refused with the spec's line, the value as JSON", () => {
  for (const [v, shown] of [[5, "5"], [1, "1"], ["4", '"4"'], [null, "null"], [undefined, "null"], [4.5, "4.5"]]) {
    const m = manifest();
    if (v === undefined) delete m.schema_version;
    else m.schema_version = v;
    assert.throws(() => checkManifest(m), {message: `manifest.json: schema_version ${shown}, this client reads 4`});
  }
  assert.throws(() => checkManifest([]), refused(/expected a JSON object/));
});

// --- R3 ---------------------------------------------------------------------------------------------------------

const bytes = (text) => new TextEncoder().encode(text);
const json = (text, max = 1 << 20) => parseJson(bytes(text), "manifest.json", max);

test("R3: an integer field's value counts, not how it is written", () => {
  const text = JSON.stringify(manifest()).replace('"max_len":8', '"max_len":8.0')
    .replace('"oos_id":3', '"oos_id":0.3e1');
  assert.match(text, /"max_len":8\.0/);
  const m = json(text);
  assert.equal(checkManifest(m).T, 8);
  for (const [path, bad] of [["max_len", 8.5], ["max_len", "8"], ["label_sets.intents", 2.5],
    ["decoding.oos_id", 1e400],
    ["tokenizer.special_ids.cls", -1], ["tokenizer.vocab_size", true], ["tokenizer.special_ids.pad", 2 ** 53]]) {
    const m = manifest(), keys = path.split("."), last = keys.pop();
    keys.reduce((o, key) => o[key], m)[last] = bad;
    assert.throws(() => checkManifest(m), refused(new RegExp(`^manifest.json: ${path}: .* is not an integer`)), path);
  }
});

test("R3: parseJson refuses what the spec's reader refuses", () => {
  const cases = [
    ['{"timeout_s": 1e400}', /out of the range of a double/],
    [`{"timeout_s": ${"9".repeat(400)}}`, /out of the range of a double/],
    ['{"a": NaN}', /invalid JSON/],
    ['{"a": 1,}', /invalid JSON/],
    ['{"a": 1} // no', /invalid JSON/],
    ['{"a": 1, "a": 2}', /duplicate key "a"/],
    ['{"a": 1, "\\u0061": 2}', /duplicate key "a"/],  // the same key, escaped
    ['{"o": {"k": 1, "k": 1}}', /duplicate key "k"/],
    ["[".repeat(33) + "]".repeat(33), /nested more than 32 deep/],
    ['{"a": "{{{{"}', null],  // brackets inside strings do not count
  ];
  for (const [text, pattern] of cases) {
    if (pattern === null) assert.deepEqual(json(text), {a: "{{{{"});
    else assert.throws(() => json(text), refused(pattern), text.slice(0, 40));
  }
  assert.deepEqual(json("[".repeat(32) + "]".repeat(32)).flat(40), []);
  assert.deepEqual(json('[{"k": 1}, {"k": 2}]'), [{k: 1}, {k: 2}]);  // one key in two objects
  assert.deepEqual(json('{"a": {"b": 1}, "b": 2}'), {a: {b: 1}, b: 2});
  assert.throws(() => parseJson(Uint8Array.of(0xef, 0xbb, 0xbf, 0x7b, 0x7d), "labels.json", 99),
    refused(/^labels.json: starts with a byte-order mark/));
  assert.throws(() => parseJson(Uint8Array.of(0x22, 0xff, 0x22), "labels.json", 99), refused(/not UTF-8/));
  assert.throws(() => json("[1, 2]", 5), refused(/6 bytes, more than the 5/));
  assert.deepEqual(json("[1, 2]", 6), [1, 2]);
});

// --- R4 ---------------------------------------------------------------------------------------------------------

test("R4: slot_tags must be present, \"O\" first, then B-x / I-x tags, each once", async () => {
  const {slot_tags: _, ...noTags} = LABELS;
  await assert.rejects(open({labels: noTags}), refused(/^labels.json: slot_tags: missing/));
  for (const tags of [["B-x", "O", "I-x", "B-y", "I-y"], ["O", "X-y", "I-x", "B-y", "I-y"],
    ["O", "B-", "I-x", "B-y", "I-y"], ["O", "B-x", "B-x", "B-y", "I-y"], ["O", "O", "I-x", "B-y", "I-y"],
    ["O", "b-x", "I-x", "B-y", "I-y"], ["O", "B-x", "I-x", "B-y", 7]]) {
    await assert.rejects(open({labels: {...LABELS, slot_tags: tags}}), refused(/^labels.json: slot_tags: expected/),
      JSON.stringify(tags));
  }
  await assert.rejects(open({labels: {...LABELS, slot_tags: ["O", "B-x"]}}), refused(/slot_tags: 2 names/));
  await assert.rejects(open({labels: {...LABELS, extra: 1}}), refused(/unknown key "extra"/));
  await assert.rejects(open({labels: {...LABELS, intents: ["a", "a", "c"]}}),
    refused(/^labels.json: intents: \["a","a","c"\] is not a list of unique non-empty names$/));
  // intent-only: [] (S = 0, no tags output); and the build's own form
  const pkg = await open({m: manifest({S: 0}), labels: {...LABELS, slot_tags: []}});
  assert.deepEqual(await predict(pkg, "play"), {intent: "a", confidence: 0.75, slots: []});
  await open({labels: {...LABELS, slot_tags: ["O", "B-long name", "I-long name", "B-y", "I-y"]}});
});

// --- R5 ---------------------------------------------------------------------------------------------------------

test("R5: tokenizer.model's piece count, normalizer and special pieces are checked", async () => {
  await open();  // the good one
  const replaced = (i, piece) => PIECES.map((p, k) => (k === i ? piece : p));
  const bad = [
    [modelProto([...PIECES, ["▁x", 1]]), /7 pieces, the manifest's tokenizer.vocab_size says 6/],
    [modelProto(PIECES, ["x"]), /normalizer "x" is not the manifest's "edgekit_bert_basic"/],
    [modelProto(PIECES, []), /normalizer "" is not/],
    [modelProto(PIECES, ["edgekit_bert_basic", "x"]), /normalizer "x"/],  // the last one wins
    [modelProto(replaced(5, ["[CLS]", 1])), /2 pieces "\[CLS\]", expected exactly one/],
    [modelProto(replaced(0, ["<pad>", 1])), /piece <pad> \(id 0\) has type 1, expected 3/],
    [modelProto(replaced(0, ["<pad>", null])), /piece <pad> \(id 0\) has type 1, expected 3/],  // absent: NORMAL
    [modelProto(replaced(1, ["<unk>", 3])), /piece <unk> \(id 1\) has type 3, expected 2/],
    [modelProto(replaced(3, ["[SEP]", 6])), /piece \[SEP\] \(id 3\) has type 6/],
    // a piece without a text still takes an id: [CLS] moves to 3 and [SEP] to 4
    [modelProto([PIECES[0], PIECES[1], [null, 1], PIECES[2], PIECES[3], PIECES[4]]), /piece \[CLS\] is id 3,/],
    [modelProto().subarray(0, 20), /not a SentencePiece ModelProto \(truncated\)/],
  ];
  for (const [b, pattern] of bad) await assert.rejects(open({bytes: b}), refused(pattern), String(pattern));
  const m = manifest();
  m.tokenizer.special_ids.cls = 5;
  await assert.rejects(open({m}), refused(/piece \[CLS\] is id 2, the manifest's tokenizer.special_ids.cls says 5/));
  // protobuf's merge: the last normalizer name wins, so a model that ends with the right one is read
  await open({bytes: modelProto(PIECES, ["x", "edgekit_bert_basic"])});
  // ids by position among the pieces, a text-less piece included
  const shifted = manifest();
  shifted.tokenizer.vocab_size = 7;
  shifted.tokenizer.special_ids = {pad: 1, unk: 2, cls: 3, sep: 4};
  await open({m: shifted, bytes: modelProto([[null, 1], ...PIECES])});
});

// --- R6 and R7 --------------------------------------------------------------------------------------------------

test("R6: the part read is the first 32 T code points; a word across the limit is cut at it", async () => {
  const pkg = await open();  // T = 8: the limit is 256
  let t = tokenize(pkg, " ".repeat(254) + "play");
  assert.deepEqual([t.words, t.cut, t.ids], [[[254, 256]], true, [2, 4, 4, 3]]);  // "pl": two pieces
  t = tokenize(pkg, "\u200b".repeat(256) + " play");
  assert.deepEqual([t.words, t.cut, t.said, t.ids], [[[0, 256]], true, false, [2, 1, 3]]);
  t = tokenize(pkg, " ".repeat(300));
  assert.deepEqual([t.words, t.cut], [[], false]);
  t = tokenize(pkg, " ".repeat(251) + "play " + "\u00a0".repeat(50));  // separators alone past the limit
  assert.deepEqual([t.words, t.cut], [[[251, 255]], false]);
  t = tokenize(pkg, " ".repeat(256) + "play");  // words past the limit only
  assert.deepEqual([t.words, t.cut, t.said], [[], true, false]);
  assert.deepEqual(await predict(pkg, " ".repeat(256) + "play"),
    {intent: "oos", confidence: 0, slots: [], tags: [], path_confidence: 0, truncated: {chars: 0, words: 0}});
  // step 4: T = 8 leaves 6 positions; the second word keeps its first 2 pieces and is cut
  t = tokenize(pkg, "aaaa bbbb cc");
  assert.deepEqual([t.ids, t.wordPos, t.cut], [[2, 4, 4, 4, 4, 4, 4, 3], [1, 5], true]);
  const answer = await predict(pkg, "aaaa bbbb cc");
  assert.deepEqual([answer.tags, answer.truncated], [["O", "O", "O"], {chars: 9, words: 2}]);
});

test("R6, R7: 32 T zero-width characters before a word say nothing: no model call", async () => {
  const pkg = await open();
  const answer = await predict(pkg, "\u200b".repeat(256) + " play");
  assert.deepEqual(answer, {intent: "oos", confidence: 0, slots: [], tags: ["O"], path_confidence: 0,
    truncated: {chars: 256, words: 1}});
  assert.equal(pkg.session.calls.length, 0);
});

test("Tokenization step 3: U+0000 is removed before SentencePiece: NUL alone says nothing, inside a word it is gone",
  async () => {
    const pkg = await open();
    const answer = await predict(pkg, "\0 \0\0");
    assert.deepEqual(answer, {intent: "oos", confidence: 0, slots: [], tags: ["O", "O"], path_confidence: 0});
    assert.equal(pkg.session.calls.length, 0);
    assert.deepEqual(tokenize(pkg, "pl\0ay q\0").ids, tokenize(pkg, "play q").ids);
  });

test("R7: a word encoded as <unk> says something; a word with no pieces does not", async () => {
  const pkg = await open({k: 2, tags: [0, 0]});
  assert.equal(tokenize(pkg, "§").said, true);
  assert.equal((await predict(pkg, "§")).intent, "c");
  assert.equal(pkg.session.calls.length, 1);
  for (const [text, tags] of [["\u200b", ["O"]], ["", []], [" \t ", []], ["\ufeff \u200d", ["O", "O"]]]) {
    const answer = await predict(pkg, text, {reject: false});
    assert.deepEqual(answer, {intent: "oos", confidence: 0, slots: [], tags, path_confidence: 0}, JSON.stringify(text));
  }
  assert.equal(pkg.session.calls.length, 1);
  // a word without pieces among words with pieces stays [unk], and the model answers
  await predict(pkg, "\u200b play");
  assert.deepEqual([...pkg.session.calls[1].input_ids.data], [2n, 1n, 4n, 3n, 0n, 0n, 0n, 0n]);
  // an invalid allow list is an error even when nothing is said
  await assert.rejects(predict(pkg, "", {allowIntents: []}), RangeError);
});

// --- R8 and R9 --------------------------------------------------------------------------------------------------

test("R8: the masks are int32 (0/1), the ids int64", async () => {
  const pkg = await open();
  await predict(pkg, "play queen", {allowIntents: ["a", "c"], reject: false});
  await predict(pkg, "play");
  const [first, second] = pkg.session.calls;
  for (const name of ["input_ids", "attention_mask", "word_pos"]) {
    assert.equal(first[name].type, "int64");
    assert.ok(first[name].data instanceof BigInt64Array, name);
  }
  for (const name of ["intent_mask", "reject"]) {  // with an allow list and without
    for (const feeds of [first, second]) {
      assert.equal(feeds[name].type, "int32");
      assert.ok(feeds[name].data instanceof Int32Array, name);
    }
  }
  assert.deepEqual([...first.intent_mask.data], [1, 0, 1]);
  assert.deepEqual([...first.reject.data], [0]);
  assert.deepEqual([...second.intent_mask.data], [1, 1, 1]);
  assert.deepEqual([...second.reject.data], [1]);
  assert.deepEqual([...first.input_ids.data], [2n, 4n, 5n, 3n, 0n, 0n, 0n, 0n]);  // padded with special_ids.pad
  assert.deepEqual([...first.attention_mask.data], [1n, 1n, 1n, 1n, 0n, 0n, 0n, 0n]);
  assert.deepEqual([...first.word_pos.data], [1n, 2n, 0n, 0n, 0n, 0n]);
});

test("R8: a manifest with bool masks (or other types) under schema 4 is refused", () => {
  for (const [k, dtype] of [[3, "bool"], [4, "bool"], [4, "uint8"], [0, "int32"]]) {
    const m = manifest();
    m.inputs[k].dtype = dtype;
    const pattern = new RegExp(`^manifest.json: inputs.${k}.dtype: "${dtype}" is not "(int64|int32)"$`);
    assert.throws(() => checkManifest(m), refused(pattern));
  }
  const m = manifest();
  [m.inputs[0], m.inputs[1]] = [m.inputs[1], m.inputs[0]];
  assert.throws(() => checkManifest(m), refused(/^manifest.json: inputs.0.name: "attention_mask" is not "input_ids"$/));
  assert.throws(() => checkManifest({...manifest(), outputs: ["intent", "confidence"]}),
    refused(/^manifest.json: outputs/));
  assert.throws(() => checkManifest({...manifest(), outputs: ["intent", "confidence", "tags"]}),  // schema 3's
    refused(/^manifest.json: outputs/));
});

test("R8: the graph's names and output types are the manifest's", async () => {
  const m = manifest();
  const s = session(m);
  s.inputNames = [...s.inputNames].reverse();
  await assert.rejects(openPackage({manifest: m, labels: LABELS, tokenizerBytes: modelProto(), ort, session: s,
    SentencePieceProcessor: FakeSentencePiece}), refused(/^model.onnx: the graph's inputs are/));
  const t = session(m);
  t.outputNames = ["intent", "confidence"];
  await assert.rejects(openPackage({manifest: m, labels: LABELS, tokenizerBytes: modelProto(), ort, session: t,
    SentencePieceProcessor: FakeSentencePiece}), refused(/^model.onnx: the graph's outputs are/));
  const pkg = await open({reply: () => ({intent: {type: "int64", data: BigInt64Array.of(0n)},
    confidence: {type: "float16", data: Uint16Array.of(0)}, tags: {type: "int64", data: new BigInt64Array(8)}})});
  await assert.rejects(predict(pkg, "play"), refused(/^model.onnx: output confidence is float16, expected float32/));
});

test("R9: input shapes are exactly the phone's or the server's", () => {
  const phone = [[0, [8]], [0, ["batch", 8]], [1, [8]], [2, [1, 8]], [3, [1, 3]], [3, [4]], [4, [2]], [4, [1, 1]],
    [4, []], [4, ["batch"]], [0, [1, 8.5]]];
  for (const [k, shape] of phone) {
    const m = manifest();
    m.inputs[k].shape = shape;
    assert.throws(() => checkManifest(m), refused(/^manifest.json: inputs.\d.shape: .* is not \[.*\] \(a /),
      `${k} ${JSON.stringify(shape)}`);
  }
  const server = [[0, [1, 8]], [3, [3]], [3, ["batch", 4]], [4, [1]], [4, ["batch", 1]], [2, ["batch", 8]]];
  for (const [k, shape] of server) {
    const m = manifest({server: true});
    m.inputs[k].shape = shape;
    assert.throws(() => checkManifest(m), refused(/^manifest.json: inputs.\d.shape: .* is not /),
      `${k} ${JSON.stringify(shape)}`);
  }
  assert.deepEqual(checkManifest(manifest()).shapes, [[1, 8], [1, 8], [1, 6], [3], [1]]);
});

test("R9: a server package (\"batch\" first) is fed as a batch of one", async () => {
  const pkg = await open({m: manifest({server: true}), k: 1, tags: [3]});
  assert.deepEqual(await predict(pkg, "play", {allowIntents: ["b"]}),
    {intent: "b", confidence: 0.75, tags: ["B-y"], path_confidence: 0.5,
      slots: [{slot: "y", value: "play", start: 0, end: 4}]});
  const feeds = pkg.session.calls[0];
  assert.deepEqual(Object.values(feeds).map((t) => t.dims), [[1, 8], [1, 8], [1, 6], [1, 3], [1]]);
  assert.deepEqual([...feeds.intent_mask.data], [0, 1, 0]);
});

// --- R10 --------------------------------------------------------------------------------------------------------

test("R10: seq_axis \"fixed\" and (server) \"dynamic\" are read; the client always pads to T", async () => {
  checkManifest({...manifest(), seq_axis: "fixed"});
  checkManifest({...manifest({server: true}), seq_axis: "dynamic"});
  checkManifest({...manifest({server: true}), seq_axis: "fixed"});
  assert.throws(() => checkManifest({...manifest(), seq_axis: "dynamic"}),
    refused(/seq_axis: dynamic needs a batched/));
  assert.throws(() => checkManifest({...manifest(), seq_axis: "static"}),
    refused(/^manifest.json: seq_axis: "static" is not "fixed" or "dynamic"$/));
  assert.throws(() => checkManifest({...manifest(), seq_axis: null}), refused(/^manifest.json: seq_axis: null is not/));
  const pkg = await open({m: {...manifest({server: true}), seq_axis: "dynamic"}});
  await predict(pkg, "play");
  assert.deepEqual(pkg.session.calls[0].input_ids.dims, [1, 8]);
});

// --- R12 --------------------------------------------------------------------------------------------------------

test("R12: intent ids out of range are refused", async () => {
  for (const k of [-1, 4, 2 ** 40]) {
    const pkg = await open({k});
    await assert.rejects(predict(pkg, "play"), (err) => err instanceof PackageError &&
      err.message === `labels.json: intents has 3 names (decoding.oos_id 3), the graph answered intent id ${k}`);
  }
  assert.equal((await predict(await open({k: 3}), "play")).intent, "oos");  // k = I = oos_id: the reserved answer
  // k = I when the data has its own out-of-scope class (oos_id < I) is refused
  const m = manifest();
  Object.assign(m.decoding, {oos_id: 0, oos_answer: "a"});
  const pkg = await open({m, labels: {...LABELS, oos_label: "a"}, k: 3});
  await assert.rejects(predict(pkg, "play"),
    refused(/intents has 3 names \(decoding.oos_id 0\), the graph answered intent id 3$/));
});

test("R12: tag ids of the words read must name a tag; columns past them are not read", async () => {
  for (const id of [5, -1]) {
    const pkg = await open({tags: [0, id]});
    await assert.rejects(predict(pkg, "play queen"), (err) => err instanceof PackageError &&
      err.message === `labels.json: slot_tags has 5 names, the graph answered tag id ${id}`);
  }
  const pkg = await open({tags: [1, 2]});  // the fake fills the rest with 99
  assert.deepEqual((await predict(pkg, "play queen")).tags, ["B-x", "I-x"]);
  // a word cut by step 4 gets O, whatever its column holds
  const cut = await open({tags: [1, 2, 77]});
  assert.deepEqual((await predict(cut, "aaaa bbbb cc")).tags, ["B-x", "I-x", "O"]);
});

// --- R13 --------------------------------------------------------------------------------------------------------

test("R13: oos_id, oos_answer and oos_label must agree", async () => {
  const m = (decoding) => { const x = manifest(); Object.assign(x.decoding, decoding); return x; };
  const disagree = refused(/^labels.json: oos_label .* disagree/);
  await assert.rejects(open({m: m({oos_answer: "none"})}), disagree);  // no oos_label: "oos"
  await assert.rejects(open({labels: {...LABELS, oos_label: "a"}}), disagree);  // oos_label while oos_id = I
  await assert.rejects(open({m: m({oos_id: 0, oos_answer: "a"})}), disagree);  // oos_id < I without oos_label
  await assert.rejects(open({m: m({oos_id: 1, oos_answer: "a"}), labels: {...LABELS, oos_label: "a"}}), disagree);
  await assert.rejects(open({m: m({oos_id: 0, oos_answer: "oos"}), labels: {...LABELS, oos_label: "a"}}), disagree);
  await assert.rejects(open({labels: {...LABELS, oos_label: "z"}}),
    refused(/oos_label: "z" is not one of the intents/));
  assert.throws(() => checkManifest(m({oos_id: 4})), refused(/decoding.oos_id: 4 is not an integer from 0 to 3/));
  // consistent: the out-of-scope class is intent 0; the model choosing it and a rejection both answer "a"
  const pkg = await open({m: m({oos_id: 0, oos_answer: "a"}), labels: {...LABELS, oos_label: "a"}, k: 0});
  assert.equal((await predict(pkg, "play")).intent, "a");
  assert.equal((await predict(pkg, "\u200b")).intent, "a");  // says nothing: oos_answer
});

// --- R14 --------------------------------------------------------------------------------------------------------

test("R14: an allow list must name an intent the graph can choose (decoding.allowed_intents)", async () => {
  const m = manifest();
  m.decoding.allowed_intents = ["a"];
  const pkg = await open({m, k: 3});
  await assert.rejects(predict(pkg, "play", {allowIntents: ["b"]}), {name: "RangeError",
    message: 'allowIntents: none of ["b"] can be answered by this package (decoding.allowed_intents)'});
  await assert.rejects(predict(pkg, "play", {allowIntents: ["b", "c"]}), RangeError);
  // a name outside G is accepted and changes nothing; a rejection answers oos_answer whatever the list says
  assert.equal((await predict(pkg, "play", {allowIntents: ["a", "b"]})).intent, "oos");
  assert.deepEqual([...pkg.session.calls[0].intent_mask.data], [1, 1, 0]);
  assert.equal((await predict(pkg, "play", {allowIntents: ["a"]})).intent, "oos");
  // the caller's list itself: non-empty, known names, a list
  await assert.rejects(predict(pkg, "play", {allowIntents: []}), /an empty list allows no intent/);
  await assert.rejects(predict(pkg, "play", {allowIntents: ["z"]}), /unknown intent "z"/);
  await assert.rejects(predict(pkg, "play", {allowIntents: "a"}), TypeError);
  // every intent in G (null): any known name will do
  assert.equal((await predict(await open({k: 2}), "play", {allowIntents: ["c"]})).intent, "c");
  // decoding.allowed_intents names intents of labels.json
  m.decoding.allowed_intents = ["a", "z"];
  await assert.rejects(open({m}), refused(/^labels.json: intents has no "z", which decoding.allowed_intents names/));
  m.decoding.allowed_intents = [];
  assert.throws(() => checkManifest(m), refused(/^manifest.json: decoding.allowed_intents: \[\] is not a non-empty list/));
});

test("arguments: text a string, reject true or false", async () => {
  const pkg = await open();
  await assert.rejects(predict(pkg, 7), /text: expected a string/);
  for (const reject of [1, null, "yes"]) await assert.rejects(predict(pkg, "play", {reject}), TypeError);
  assert.equal(pkg.session.calls.length, 0);
});

test("the manifest's other fields this client reads: files, models, tokenizer", () => {
  const cases = [
    [(m) => { m.models = {executorch: "model.pte"}; },
      /^manifest.json: models.onnx: missing \(this client runs the ONNX model; the package has \["executorch"\]\)$/],
    [(m) => { delete m.files["labels.json"]; }, /"labels.json" is not a file name listed in files/],
    [(m) => { m.labels = "../labels.json"; }, /is not a file name listed in files/],
    [(m) => { m.labels = "constructor"; }, /"constructor" is not a file name listed in files/],  // not inherited
    [(m) => { m.tokenizer.normalizer = "nfkc"; }, /tokenizer.normalizer: "nfkc" is not "edgekit_bert_basic"/],
    [(m) => { delete m.tokenizer; }, /^manifest.json: tokenizer: missing$/],
    [(m) => { delete m.decoding.oos_answer; }, /^manifest.json: decoding.oos_answer: missing$/],
  ];
  for (const [edit, pattern] of cases) {
    const m = manifest();
    edit(m);
    assert.throws(() => checkManifest(m), refused(pattern), String(pattern));
  }
});

// --- every field this client reads, set to each JSON type -------------------------------------------------------

const JSON_TYPES = [["null", null], ["true", true], ["0", 0], ["1.5", 1.5], ['"x"', "x"], ["[]", []], ["[4]", [4]],
  ["{}", {}]];
const MISSING = Symbol("missing");
/** A JSON value's type as the schema names it ("integer" for 0, "number" for 1.5). */
const typeOf = (v) => (v === null ? "null" : Array.isArray(v) ? "array" : Number.isInteger(v) ? "integer" : typeof v);

/** A copy of `json` with the field at the dotted `path` set to `value` (MISSING: removed). */
function edited(json, path, value) {
  const copy = structuredClone(json), keys = path.split("."), last = keys.pop();
  const parent = keys.reduce((o, key) => o[key], copy);
  if (value === MISSING) delete parent[last];
  else parent[last] = structuredClone(value);
  return copy;
}

/** What a caller does with a package (checkManifest, sessionOptions, openPackage, predict): "opened" or the error. */
async function outcome(m, labels = LABELS) {
  try {
    checkManifest(m);
    sessionOptions(m);
    await predict(await open({m, labels}), "play queen");
    return "opened";
  } catch (err) {
    return err;
  }
}

/** [path, the schema's types for it, {reported: the field the message names (default: path), optional, base}] */
const MANIFEST_FIELDS = [
  ["max_len", ["integer"]], ["profile", ["string"]], ["schema", ["string"]], ["labels", ["string"]],
  ["label_sets", ["object"]], ["label_sets.intents", ["integer"]], ["label_sets.slot_tags", ["integer"]],
  ["tokenizer", ["object"]], ["tokenizer.type", ["string"]], ["tokenizer.file", ["string"]],
  ["tokenizer.normalizer", ["string"]], ["tokenizer.vocab_size", ["integer"]], ["tokenizer.special_ids", ["object"]],
  ...["pad", "unk", "cls", "sep"].map((key) => [`tokenizer.special_ids.${key}`, ["integer"]]),
  ["inputs", ["array"]], ["inputs.0", ["object"]], ["inputs.4", ["object"]], ["inputs.0.name", ["string"]],
  ["inputs.3.dtype", ["string"]], ["inputs.0.shape", ["array"]], ["inputs.4.shape", ["array"]],
  ["inputs.0.shape.1", ["integer"], {reported: "inputs.0.shape"}],
  ["inputs.3.shape.0", ["integer"], {reported: "inputs.3.shape"}],
  ["outputs", ["array"]], ["outputs.0", ["string"], {reported: "outputs"}],
  ["seq_axis", ["string"], {optional: true}],
  ["onnx_disabled_optimizers", ["array"], {optional: true}],
  ["onnx_disabled_optimizers.0", ["string"], {base: {onnx_disabled_optimizers: ["SkipLayerNormFusion"]}}],
  ["decoding", ["object"]], ["decoding.oos_id", ["integer"]], ["decoding.oos_answer", ["string"]],
  ["decoding.allowed_intents", ["array", "null"]],
  ["decoding.allowed_intents.0", ["string"], {base: {decoding: {...manifest().decoding, allowed_intents: ["a"]}}}],
  ["models", ["object"]], ["models.onnx", ["string"]], ["files", ["object"]],
];
const LABELS_FIELDS = [
  ["intents", ["array"]], ["intents.0", ["string"], {reported: "intents"}],
  ["slot_tags", ["array"]], ["slot_tags.1", ["string"], {reported: "slot_tags"}],
  ["oos_label", ["string", "null"], {optional: true}],
];

/** Each field of `fields` in `file` set to each JSON type, and removed: a wrong type (or a required field removed)
 * is a PackageError naming that field, `FILE: FIELD: ...`; a right type opens or is a PackageError; nothing is
 * ever another error. Answers the cases that broke this, one line each. */
async function typeFailures(file, fields) {
  const failures = [];
  for (const [path, types, {reported = path, optional = false, base = {}} = {}] of fields) {
    const element = /\.\d+$/.test(path);  // an array's item: removing it is not a type case
    for (const [name, value] of [...JSON_TYPES, ...(element ? [] : [["missing", MISSING]])]) {
      const wrong = value === MISSING ? !optional : !types.includes(typeOf(value));
      const got = file === "manifest.json" ? await outcome(edited({...manifest(), ...base}, path, value))
        : await outcome(manifest(), edited(LABELS, path, value));
      const want = `${file}: ${reported}: ${value === MISSING ? "missing" : ""}`;
      const what = got === "opened" ? "opened" : `${got.constructor.name}: ${got.message}`;
      if (got !== "opened" && !(got instanceof PackageError)) failures.push(`${path} = ${name}: ${what}`);
      else if (wrong && !(got instanceof PackageError && got.message.startsWith(want))) {
        failures.push(`${path} = ${name}: ${what} (expected a PackageError "${want}...")`);
      }
    }
  }
  return failures;
}

test("types: every manifest field the client reads, set to each JSON type or removed, is refused by name", async () => {
  assert.equal(await outcome(manifest()), "opened");
  assert.equal(await outcome({...manifest(), onnx_disabled_optimizers: ["SkipLayerNormFusion"]}), "opened");
  assert.deepEqual(await typeFailures("manifest.json", MANIFEST_FIELDS), []);
  for (const [, value] of JSON_TYPES.filter(([, v]) => typeOf(v) !== "object")) {
    assert.throws(() => checkManifest(value), {name: "Error", message: "manifest.json: expected a JSON object"});
  }
});

test("types: labels.json's fields, set to each JSON type or removed, are refused by name", async () => {
  assert.deepEqual(await typeFailures("labels.json", LABELS_FIELDS), []);
  for (const [, value] of JSON_TYPES.filter(([, v]) => typeOf(v) !== "object")) {
    await assert.rejects(open({labels: value}), refused(/^labels.json: expected a JSON object$/));
  }
});

test("R2: a schema_version of another JSON type is refused with the spec's line, the value as JSON", () => {
  for (const [v, shown] of [[[4], "[4]"], ["4", '"4"'], [true, "true"], [false, "false"], [null, "null"], [{}, "{}"],
    [4.5, "4.5"], [[], "[]"]]) {
    assert.throws(() => checkManifest({...manifest(), schema_version: v}), (err) => err instanceof PackageError &&
      err.message === `manifest.json: schema_version ${shown}, this client reads 4`, shown);
  }
  assert.equal(checkManifest(json(JSON.stringify(manifest()).replace('"schema_version":4', '"schema_version":4.0'))).T,
    8);  // 4.0 is the number 4 (R3)
});

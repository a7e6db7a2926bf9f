/**
 * A client for edgekit packages (schema version 4), written from docs/package-format.md alone.
 *
 * Runs in Node and in a browser: nothing is imported at the top level (the tests run it with fakes, no npm
 * install). The caller brings the package's files and an ONNX Runtime (onnxruntime-node or onnxruntime-web,
 * same API):
 *
 *   import * as ort from "onnxruntime-web";
 *   const manifest = parseJson(manifestBytes, "manifest.json", MANIFEST_BYTES);
 *   checkManifest(manifest);  // before any other file is used
 *   const session = await ort.InferenceSession.create(modelBytes, sessionOptions(manifest));
 *   const pkg = await openPackage({manifest, labels, tokenizerBytes, ort, session});
 *   const answer = await predict(pkg, "play queen on spotify");
 *
 * The spec's rules, where this file applies them: R2 (schema_version 4 only; a schema 2 or 3 package, with bool
 * masks or without path_confidence, is refused with the spec's line), R3 (parseJson; the integer fields it
 * reads), R4 (labels.json), R5 (tokenizer.model's pieces and normalizer), R6 and R7 (tokenize), R8 (int32 masks, int64 ids, the outputs'
 * types), R9 (exact input shapes, phone or server), R10 (seq_axis: always padded to T, which either value
 * allows), R12 (ids out of range), R13 (oos_id, oos_answer and oos_label agree), R14 (allow lists against
 * decoding.allowed_intents). Not R1: there is no JSON Schema validator here, so a manifest is held to the checks
 * below on the fields this client reads, not to the whole schema (an unknown field passes). Not R11: buckets are
 * ExecuTorch's, and this client runs the ONNX model.
 *
 * In a browser, a bundler resolves the bare imports; @sctg/sentencepiece-js imports Node's `fs` at
 * its top level (used only by its `load(path)`), so the bundler must stub it (webpack: fallback fs: false).
 */

export const SCHEMA_VERSION = 4;
export const NORMALIZER = "edgekit_bert_basic";
export const MANIFEST_BYTES = 1 << 20;  // R3: the largest manifest.json, 1 MiB
export const LABELS_BYTES = 4 << 20;  // R3: the largest labels.json, 4 MiB
const MAX_DEPTH = 32;  // R3: arrays and objects inside one another

/** The graph's inputs in order, with their element types (R8): the masks are int32, which every binding makes. */
const INPUTS = [["input_ids", "int64"], ["attention_mask", "int64"], ["word_pos", "int64"],
  ["intent_mask", "int32"], ["reject", "int32"]];
/** The graph's outputs' element types (R8). */
const OUTPUT_TYPES = {intent: "int64", confidence: "float32", tags: "int64", path_confidence: "float32"};
/** The special pieces by their text, and the SentencePiece type each must have (R5: 2 UNKNOWN, 3 CONTROL). */
const SPECIALS = {pad: ["<pad>", 3], unk: ["<unk>", 2], cls: ["[CLS]", 3], sep: ["[SEP]", 3]};

/** The package cannot be used by this client (Python `PackageError`). */
export class PackageError extends Error {}
/** The utterance cannot be read (Python `InputError`, `edgekit predict` exit 2). */
export class InputError extends Error {}

/** The 29 separators of the spec's Tokenization step 2 (Python 3.11 `str.isspace()`), as code points. */
export function isSeparator(cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp === 0x85 || cp === 0xa0 ||
    cp === 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp === 0x2028 || cp === 0x2029 ||
    cp === 0x202f || cp === 0x205f || cp === 0x3000;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
/** A value in a message: JSON text (a number as JavaScript writes it, so Infinity stays Infinity), one short line. */
const show = (v) => {
  const text = typeof v === "number" ? String(v) : JSON.stringify(v) ?? String(v);
  return text.length <= 80 ? text : `${text.slice(0, 77)}...`;
};

/**
 * A package's JSON file from its bytes, as R3 says: at most `maxBytes`, UTF-8 without a byte-order mark, one
 * strict JSON value (JSON.parse refuses NaN, comments and trailing commas), nested at most 32 deep, no key twice
 * in one object (JSON.parse would keep the last one silently), and no number that rounds to infinity (JSON.parse
 * reads `1e400` and a 400-digit integer as Infinity). `16.0` is read as 16: an integer field's value is what counts.
 */
export function parseJson(bytes, file, maxBytes) {
  const fail = (why) => { throw new PackageError(`${file}: ${why}`); };
  if (bytes.length > maxBytes) fail(`${bytes.length} bytes, more than the ${maxBytes} it may have`);
  if (bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) fail("starts with a byte-order mark");
  let text, value;
  try {
    text = new TextDecoder("utf-8", {fatal: true}).decode(bytes);
  } catch {
    fail("not UTF-8");
  }
  try {
    value = JSON.parse(text);  // V8's parser does not recurse, so depth is counted after it
  } catch (err) {
    fail(`invalid JSON (${err.message})`);
  }
  // Depth and repeated keys, by a scan of the (now known valid) text: no recursion, however deep it nests
  const open = [];  // per open container: the keys seen (an object) or null (an array)
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "{" || c === "[") {
      open.push(c === "{" ? new Set() : null);
      if (open.length > MAX_DEPTH) fail(`arrays and objects nested more than ${MAX_DEPTH} deep`);
    } else if (c === "}" || c === "]") {
      open.pop();
    } else if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      let k = j + 1;
      while (" \t\n\r".includes(text[k])) k++;
      if (text[k] === ":") {  // a key of the innermost object (a string followed by a colon is nothing else)
        const key = JSON.parse(text.slice(i, j + 1)), keys = open.at(-1);
        if (keys.has(key)) fail(`duplicate key ${JSON.stringify(key)} (each key may appear once in an object)`);
        keys.add(key);
      }
      i = j;
    }
  }
  const finite = (v) => {
    if (typeof v === "number" && !Number.isFinite(v)) fail("a number out of the range of a double");
    if (v !== null && typeof v === "object") Object.values(v).forEach(finite);  // at most 32 deep: checked above
  };
  finite(value);
  return value;
}

/** Fields of a protobuf message as [field number, number | bytes] pairs (fixed-width values skipped). */
function* protoFields(buf) {
  const bad = (why) => new PackageError(`tokenizer.model: not a SentencePiece ModelProto (${why})`);
  let i = 0;
  const varint = () => {
    let v = 0, scale = 1, byte;
    do {
      if (i >= buf.length) throw bad("truncated");
      byte = buf[i++]; v += (byte & 0x7f) * scale; scale *= 128;
    } while (byte & 0x80);
    return v;
  };
  while (i < buf.length) {
    const key = varint(), wire = key & 7, field = Math.floor(key / 8);
    if (wire === 0) yield [field, varint()];
    else if (wire === 2) {
      const n = varint();
      if (i + n > buf.length) throw bad("truncated");
      yield [field, buf.subarray(i, i + n)];
      i += n;
    } else if (wire === 1 || wire === 5) i += wire === 1 ? 8 : 4;
    else throw bad(`wire type ${wire}`);
  }
  if (i > buf.length) throw bad("truncated");
}

/**
 * The pieces ({text, type}) and normalizer name of a SentencePiece `ModelProto`, read as R5 says: a piece's id is
 * its position among field 1's entries, a piece without a text has "" (it still takes an id), a type absent is 1
 * (NORMAL), and the last normalizer name wins (protobuf's merge of repeated `normalizer_spec` fields).
 */
function readModelProto(bytes) {
  const text = new TextDecoder();
  const pieces = [];
  let normalizer = "";
  for (const [field, value] of protoFields(bytes)) {
    if (field === 1 && typeof value !== "number") {
      const piece = {text: "", type: 1};
      for (const [f, v] of protoFields(value)) {
        if (f === 1 && typeof v !== "number") piece.text = text.decode(v);
        if (f === 3 && typeof v === "number") piece.type = v;
      }
      pieces.push(piece);
    }
    if (field === 3 && typeof value !== "number") {
      for (const [f, v] of protoFields(value)) if (f === 1 && typeof v !== "number") normalizer = text.decode(v);
    }
  }
  return {pieces, normalizer};
}

/** R5: refuse a tokenizer.model whose piece count, normalizer or special pieces are not the manifest's. */
function checkTokenizer(bytes, tok) {
  const fail = (why) => { throw new PackageError(`tokenizer.model: ${why}`); };
  const {pieces, normalizer} = readModelProto(bytes);
  if (pieces.length !== tok.vocab_size) {
    fail(`${pieces.length} pieces, the manifest's tokenizer.vocab_size says ${tok.vocab_size}`);
  }
  if (normalizer !== tok.normalizer) {
    fail(`normalizer ${JSON.stringify(normalizer)} is not the manifest's ${JSON.stringify(tok.normalizer)}`);
  }
  for (const [key, [text, type]] of Object.entries(SPECIALS)) {  // found by text: SentencePiece's PieceToId agrees
    const ids = pieces.flatMap((p, id) => (p.text === text ? [id] : []));
    if (ids.length !== 1) fail(`${ids.length} pieces ${JSON.stringify(text)}, expected exactly one`);
    const got = pieces[ids[0]].type;
    if (got !== type) fail(`piece ${text} (id ${ids[0]}) has type ${got}, expected ${type}`);
    if (ids[0] !== tok.special_ids[key]) {
      fail(`piece ${text} is id ${ids[0]}, the manifest's tokenizer.special_ids.${key} says ${tok.special_ids[key]}`);
    }
  }
}

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/**
 * Refuse a manifest this client cannot read, before any other file is used (spec, Versioning): R2 first, then each
 * field this client (or the page) reads, its type before its value: integers where the schema has integers (R3),
 * the tokenizer, file names that are plain names listed in `files`, the inputs' names, element types (R8) and exact
 * shapes (R9), the outputs, `seq_axis` (R10), `onnx_disabled_optimizers`, `profile` and `decoding`. A wrong one is
 * one PackageError line, `manifest.json: FIELD: WHY`, FIELD the dotted path (`inputs.0.shape`,
 * `tokenizer.special_ids.cls`) and WHY `missing` or `VALUE is not WHAT`, VALUE as JSON. Answers T, I, S and the
 * shapes the feeds take (a server's "batch" sent as B = 1).
 */
export function checkManifest(manifest) {
  if (!isObject(manifest)) throw new PackageError("manifest.json: expected a JSON object");
  const version = manifest.schema_version ?? null;  // R2: read before any other field
  if (version === 2 || version === 3) {
    throw new PackageError(`manifest.json: schema_version ${version} is not supported by this client (it reads ` +
      `${SCHEMA_VERSION}); rebuild the package with an edgekit that writes schema_version ${SCHEMA_VERSION}`);
  }
  if (version !== SCHEMA_VERSION) {
    throw new PackageError(`manifest.json: schema_version ${JSON.stringify(version)}, this client reads ` +
      `${SCHEMA_VERSION}`);
  }
  const fail = (path, why) => { throw new PackageError(`manifest.json: ${path}: ${why}`); };
  const need = (ok, path, value, what) => (ok ? value : fail(path, `${show(value)} is not ${what}`));
  const at = (path) => path.split(".").reduce((v, key, i, keys) => {  // a field the schema requires, or refused
    need(Array.isArray(v) ? /^\d+$/.test(key) : isObject(v), keys.slice(0, i).join("."), v, "an object");
    if (!Object.hasOwn(v, key)) fail(keys.slice(0, i + 1).join("."), "missing");
    return v[key];
  }, manifest);
  const int = (path, min, max = Number.MAX_SAFE_INTEGER) => {  // R3: 16 and 16.0 are one value; 16.5, "16" are not
    const v = at(path);
    return need(Number.isSafeInteger(v) && v >= min && v <= max, path, v, `an integer from ${min} to ${max}`);
  };
  const one = (path, ...allowed) => {
    const v = at(path);
    return need(allowed.includes(v), path, v, allowed.map(show).join(" or "));
  };
  const object = (path) => { const v = at(path); return need(isObject(v), path, v, "an object"); };
  const names = (path, v, least = 1) => {  // a list of non-empty strings, `least` of them or more
    need(Array.isArray(v) && v.length >= least, path, v, `a ${least ? "non-empty " : ""}list of names`);
    v.forEach((name, k) => need(typeof name === "string" && name !== "", `${path}.${k}`, name, "a name"));
  };

  const T = int("max_len", 8, 512);
  object("label_sets");
  const I = int("label_sets.intents", 2), S = int("label_sets.slot_tags", 0);
  object("tokenizer");
  one("tokenizer.type", "sentencepiece");
  one("tokenizer.normalizer", NORMALIZER);
  int("tokenizer.vocab_size", 5);
  object("tokenizer.special_ids");
  for (const key of Object.keys(SPECIALS)) int(`tokenizer.special_ids.${key}`, 0);
  const profile = at("profile");  // the page shows it
  need(typeof profile === "string" && profile !== "", "profile", profile, "a profile name");
  const files = object("files"), models = object("models");
  if (!Object.hasOwn(models, "onnx")) {
    fail("models.onnx", `missing (this client runs the ONNX model; the package has ${show(Object.keys(models))})`);
  }
  for (const path of ["schema", "labels", "tokenizer.file", ...Object.keys(models).map((key) => `models.${key}`)]) {
    const name = at(path), plain = typeof name === "string" && /^(?!\.\.?$)[^/\\]+$/.test(name);
    need(plain && Object.hasOwn(files, name), path, name, "a file name listed in files");
  }
  if (Object.hasOwn(manifest, "onnx_disabled_optimizers")) {
    names("onnx_disabled_optimizers", manifest.onnx_disabled_optimizers, 0);
  }

  // R8 and R9: names and element types in order, and each shape exactly the phone's or the server's
  const inputs = at("inputs");
  need(Array.isArray(inputs) && inputs.length === INPUTS.length, "inputs", inputs, `a list of ${INPUTS.length} inputs`);
  INPUTS.forEach(([name, dtype], k) => { one(`inputs.${k}.name`, name); one(`inputs.${k}.dtype`, dtype); });
  const shapes = INPUTS.map((_, k) => at(`inputs.${k}.shape`));
  const batched = Array.isArray(shapes[0]) && shapes[0][0] === "batch";
  const want = batched ? [["batch", T], ["batch", T], ["batch", T - 2], ["batch", I], ["batch"]]
    : [[1, T], [1, T], [1, T - 2], [I], [1]];
  shapes.forEach((shape, k) => need(JSON.stringify(shape) === JSON.stringify(want[k]), `inputs.${k}.shape`, shape,
    `${show(want[k])} (${batched ? "a server package: \"batch\" first on every input" : "a phone package"})`));
  const outputs = ["intent", "confidence", ...(S > 0 ? ["tags", "path_confidence"] : [])];
  const named = at("outputs");
  need(JSON.stringify(named) === JSON.stringify(outputs), "outputs", named,
    `${show(outputs)} (label_sets.slot_tags ${S})`);
  if (Object.hasOwn(manifest, "seq_axis")) {  // R10: this client pads to T, right under either value
    if (one("seq_axis", "fixed", "dynamic") === "dynamic" && !batched) {
      fail("seq_axis", "dynamic needs a batched graph ('batch' inputs)");
    }
  }

  object("decoding");
  int("decoding.oos_id", 0, I);  // R12, R13: I is the reserved id of data without an out-of-scope class
  const answer = at("decoding.oos_answer"), allowed = at("decoding.allowed_intents");
  need(typeof answer === "string" && answer !== "", "decoding.oos_answer", answer, "an intent name");
  if (allowed !== null) names("decoding.allowed_intents", allowed);  // null: every intent (R14)
  return {T, I, S, shapes: want.map((shape) => shape.map((d) => (d === "batch" ? 1 : d)))};
}

/**
 * R4, R13 and R14 on labels.json: `intents` unique names, I of them; `slot_tags` present, `[]` or "O" then B-x/I-x
 * tags, each once, S of them; `oos_label` and the manifest's `decoding.oos_id` and `oos_answer` agree;
 * `decoding.allowed_intents` names intents. Answers G, the set of intents the graph can choose (R14).
 */
function checkLabels(labels, manifest, I, S) {
  const fail = (why) => { throw new PackageError(`labels.json: ${why}`); };
  if (!isObject(labels)) fail("expected a JSON object");
  const other = Object.keys(labels).find((key) => !["intents", "slot_tags", "oos_label"].includes(key));
  if (other !== undefined) fail(`unknown key ${JSON.stringify(other)}`);
  const {intents, slot_tags: tags} = labels, oos = labels.oos_label ?? null;
  if (!Object.hasOwn(labels, "intents")) fail("intents: missing");
  if (!Array.isArray(intents) || !intents.every((n) => typeof n === "string" && n !== "") ||
      new Set(intents).size !== intents.length) {
    fail(`intents: ${show(intents)} is not a list of unique non-empty names`);
  }
  if (!Object.hasOwn(labels, "slot_tags")) fail("slot_tags: missing (an intent-only package has [])");
  if (!Array.isArray(tags)) fail(`slot_tags: ${show(tags)} is not a list of tags (an intent-only package has [])`);
  const bio = (t) => typeof t === "string" && t.length > 2 && (t.startsWith("B-") || t.startsWith("I-"));
  if (tags.length > 0 && !(tags[0] === "O" && tags.slice(1).every(bio) && new Set(tags).size === tags.length)) {
    fail('slot_tags: expected "O" first, then tags B-x or I-x (x not empty), each once');
  }
  if (intents.length !== I) fail(`intents: ${intents.length} names, the manifest's label_sets.intents says ${I}`);
  if (tags.length !== S) fail(`slot_tags: ${tags.length} names, the manifest's label_sets.slot_tags says ${S}`);
  if (oos !== null && !intents.includes(oos)) fail(`oos_label: ${show(oos)} is not one of the intents`);

  // R13: every rejection answers oos_answer, whichever id it came by: the three fields must say the same thing
  const {oos_id: oosId, oos_answer: answer, allowed_intents: allowed} = manifest.decoding;
  const agree = oos === null ? oosId === I && answer === "oos" : oosId < I && intents[oosId] === oos && answer === oos;
  if (!agree) {
    fail(`oos_label ${JSON.stringify(oos)}, decoding.oos_id ${oosId} and decoding.oos_answer ` +
      `${JSON.stringify(answer)} disagree (no oos_label: oos_id ${I} and oos_answer "oos"; an oos_label: ` +
      "intents[oos_id] = oos_label = oos_answer)");
  }
  const unknown = (allowed ?? []).find((name) => !intents.includes(name));
  if (unknown !== undefined) fail(`intents has no ${JSON.stringify(unknown)}, which decoding.allowed_intents names`);
  return new Set(allowed ?? intents);
}

/**
 * ONNX Runtime session options for the package's model: `base`, plus the graph optimizers the build left out on
 * purpose (`manifest.onnx_disabled_optimizers`, spec) as the session config entry
 * `optimization.disable_specified_optimizers`; onnxruntime-node and -web pass `extra` through as config entries.
 * Without it ONNX Runtime fuses those ops back at load: the same answers, slower.
 */
export function sessionOptions(manifest, base = {}) {
  const off = manifest.onnx_disabled_optimizers ?? [];
  if (off.length === 0) return base;
  const extra = base.extra ?? {};
  return {...base, extra: {...extra, optimization: {...extra.optimization, disable_specified_optimizers: off.join(",")}}};
}

/**
 * Check a package and load its tokenizer. `manifest` and `labels` are the parsed JSON files (read them with
 * `parseJson`), `tokenizerBytes` the bytes of `tokenizer.model`, `session` an ONNX Runtime session on `model.onnx`
 * and `ort` the module it came from (for `ort.Tensor`). `SentencePieceProcessor` defaults to
 * `@sctg/sentencepiece-js`'s.
 */
export async function openPackage({manifest, labels, tokenizerBytes, ort, session, SentencePieceProcessor}) {
  const {T, I, S, shapes} = checkManifest(manifest);
  const choosable = checkLabels(labels, manifest, I, S);
  const model = manifest.models.onnx;
  const names = [manifest.inputs.map((input) => input.name), manifest.outputs];
  // R8: the graph is the one the manifest describes (names in order; the types are checked on the outputs in predict)
  for (const [k, graph] of [session.inputNames, session.outputNames].entries()) {
    if (JSON.stringify(graph) !== JSON.stringify(names[k])) {
      throw new PackageError(`${model}: the graph's ${k ? "outputs" : "inputs"} are ${JSON.stringify(graph)}, ` +
        `the manifest says ${JSON.stringify(names[k])}`);
    }
  }
  const bytes = new Uint8Array(tokenizerBytes);
  checkTokenizer(bytes, manifest.tokenizer);
  SentencePieceProcessor ??= (await import("@sctg/sentencepiece-js")).SentencePieceProcessor;
  const sp = new SentencePieceProcessor();
  await sp.loadFromB64StringModel(toBase64(bytes));
  return {manifest, labels, sp, ort, session, shapes, T, I, S, choosable};
}

/**
 * Tokenize `text` (spec, Tokenization): the code points read, the words as [start, end) code point
 * spans, the model's input ids, each reached word's first position, whether anything was cut, and
 * whether a reached word gave a piece of its own (`said`; false: nothing to answer, spec Answer).
 */
export function tokenize(pkg, text) {
  const {T, sp} = pkg, special = pkg.manifest.tokenizer.special_ids;
  const chars = [];
  let cut = false;
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    if (chars.length === 32 * T) {
      if (!isSeparator(cp)) { cut = true; break; }
      continue;
    }
    if (cp >= 0xd800 && cp <= 0xdfff) throw new InputError(`lone surrogate at code point ${chars.length}`);
    chars.push(ch);
  }
  const words = [];
  for (let i = 0; i < chars.length; i++) {
    const cp = chars[i].codePointAt(0);
    if (isSeparator(cp)) continue;
    if (i > 0 && !isSeparator(chars[i - 1].codePointAt(0))) words.at(-1)[1] = i + 1;
    else words.push([i, i + 1]);
  }
  const ids = [special.cls], wordPos = [];
  let said = false;
  for (const [start, end] of words) {
    const room = T - 1 - ids.length;
    if (room === 0) { cut = true; break; }
    // U+0000 removed first (spec, Tokenization step 3): the normalizer drops every other control character, but its
    // compiled table cannot hold NUL, so "\0" alone would be a byte piece and an intent
    let pieces = sp.encodeIds(chars.slice(start, end).join("").replaceAll("\0", ""));
    said ||= pieces.length > 0;
    if (pieces.length === 0) pieces = [special.unk];
    wordPos.push(ids.length);
    ids.push(...pieces.slice(0, room));
    if (pieces.length > room) { cut = true; break; }
  }
  ids.push(special.sep);
  return {chars, words, ids, wordPos, cut, said};
}

/**
 * The intent_mask for `allowIntents` (R14): null allows every intent; a list must be non-empty, name intents of
 * labels.json, and name at least one intent in G (`decoding.allowed_intents`, the ones the graph can choose:
 * with none of them, the graph would answer an intent the caller did not allow). Names outside G are sent as 1
 * and change nothing. int32 (R8), 1 allowed and 0 not.
 */
function intentMask(pkg, allowIntents) {
  const {labels, I, choosable} = pkg;
  if (allowIntents === null) return new Int32Array(I).fill(1);
  if (!Array.isArray(allowIntents)) throw new TypeError("allowIntents: expected null or a list of intent names");
  if (allowIntents.length === 0) throw new RangeError("allowIntents: an empty list allows no intent");
  const mask = new Int32Array(I);
  for (const name of allowIntents) {
    const k = labels.intents.indexOf(name);
    if (k < 0) throw new RangeError(`allowIntents: unknown intent ${JSON.stringify(name)}`);
    mask[k] = 1;
  }
  if (!allowIntents.some((name) => choosable.has(name))) {
    throw new RangeError(`allowIntents: none of ${JSON.stringify(allowIntents)} can be answered by this package ` +
      "(decoding.allowed_intents)");
  }
  return mask;
}

/**
 * The name of intent id k (R12): intents[k] for 0 <= k < I (k = oos_id < I is the out-of-scope class, whose name
 * is oos_answer by R13), oos_answer for k = I when that is the reserved oos_id; any other id is refused rather
 * than answered as `undefined` or as the wrong intent.
 */
function intentName(pkg, k) {
  const {labels, manifest, I} = pkg, {oos_id: oosId, oos_answer: answer} = manifest.decoding;
  if (Number.isInteger(k) && k >= 0 && k < I) return labels.intents[k];
  if (k === I && oosId === I) return answer;
  throw new PackageError(`labels.json: intents has ${I} names (decoding.oos_id ${oosId}), the graph answered ` +
    `intent id ${k}`);
}

/**
 * Answer one utterance (spec, Answer): `{intent, confidence, slots, tags, path_confidence, truncated}`, with
 * `tags` and `path_confidence` only for packages with slots and `truncated` only when something was cut.
 * `allowIntents` is null (every intent) or a non-empty list of the package's intents (R14); `reject` (true or false) turns
 * out-of-scope rejection on.
 */
export async function predict(pkg, text, {allowIntents = null, reject = true} = {}) {
  const {manifest, labels, ort, session, shapes, T, S} = pkg;
  if (typeof text !== "string") throw new InputError(`text: expected a string, got ${typeof text}`);
  if (typeof reject !== "boolean") throw new TypeError(`reject: expected true or false, got ${JSON.stringify(reject)}`);
  const mask = intentMask(pkg, allowIntents);  // an invalid list is an error even when nothing is said (R7)
  const {chars, words, ids, wordPos, cut, said} = tokenize(pkg, text);
  const int64 = (values, length) => {
    const a = new BigInt64Array(length);
    values.forEach((v, i) => { a[i] = BigInt(v); });
    return a;
  };
  const data = [
    int64(ids, T).fill(BigInt(manifest.tokenizer.special_ids.pad), ids.length),
    int64(ids.map(() => 1), T),
    int64(wordPos, T - 2),
    mask,
    Int32Array.of(reject ? 1 : 0),
  ];
  const feeds = {};
  INPUTS.forEach(([name, dtype], k) => { feeds[name] = new ort.Tensor(dtype, data[k], shapes[k]); });
  // Nothing said (no word read, or zero-width and control characters only): no model call, the out-of-scope
  // answer with confidence 0 (R7); "O" for each word and no slots below
  const out = said ? await session.run(feeds) : null;
  for (const name of out ? manifest.outputs : []) {  // R8: an output of another type would be misread
    if (out[name]?.type !== OUTPUT_TYPES[name]) {
      const got = out[name]?.type;
      throw new PackageError(`${manifest.models.onnx}: output ${name} is ${got}, expected ${OUTPUT_TYPES[name]}`);
    }
  }

  const answer = {
    intent: out ? intentName(pkg, Number(out.intent.data[0])) : manifest.decoding.oos_answer,
    confidence: out ? Number(out.confidence.data[0]) : 0,
    slots: [],
  };
  if (S > 0) {
    // R12: only the columns of words that reached the model are read, each a tag id of labels.json
    const tag = (w) => {
      const id = Number(out.tags.data[w]);
      if (!(Number.isInteger(id) && id >= 0 && id < S)) {
        throw new PackageError(`labels.json: slot_tags has ${S} names, the graph answered tag id ${id}`);
      }
      return labels.slot_tags[id];
    };
    answer.tags = words.map((_, w) => (out && w < wordPos.length ? tag(w) : "O"));
    answer.slots = groupSlots(answer.tags, words, chars);
    answer.path_confidence = out ? Number(out.path_confidence.data[0]) : 0;  // the whole answer's probability
  }
  if (cut) {
    const W = wordPos.length;
    answer.truncated = {chars: W > 0 ? words[W - 1][1] : 0, words: W};
  }
  return answer;
}

/** Group BIO tags into slots word by word (spec, Answer: `slots`). */
export function groupSlots(tags, words, chars) {
  const spans = [];
  let open = null;
  tags.forEach((tag, w) => {
    if (tag === "O") { open = null; return; }
    const name = tag.slice(2);
    if (tag.startsWith("I-") && open && open.slot === name) open.last = w;
    else spans.push(open = {slot: name, first: w, last: w});
  });
  return spans.map(({slot, first, last}) => {
    const start = words[first][0], end = words[last][1];
    return {slot, value: chars.slice(start, end).join(""), start, end};
  });
}

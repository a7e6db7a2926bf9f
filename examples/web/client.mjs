/**
 * A client for edgekit packages (schema version 2), written from docs/package-format.md alone.
 *
 * Runs in Node and in a browser: nothing Node-only is imported here. The caller brings the
 * package's files and an ONNX Runtime (onnxruntime-node or onnxruntime-web, same API):
 *
 *   import * as ort from "onnxruntime-web";
 *   const session = await ort.InferenceSession.create(modelBytes);
 *   const pkg = await openPackage({manifest, labels, tokenizerBytes, ort, session});
 *   const answer = await predict(pkg, "play queen on spotify");
 *
 * In a browser, a bundler resolves the bare imports; @sctg/sentencepiece-js imports Node's `fs` at
 * its top level (used only by its `load(path)`), so the bundler must stub it (webpack: fallback fs: false).
 */

export const SCHEMA_VERSION = 2;
export const NORMALIZER = "edgekit_bert_basic";

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

/** Fields of a protobuf message as [field number, number | bytes] pairs (fixed-width values skipped). */
function* protoFields(buf) {
  let i = 0;
  const varint = () => {
    let v = 0, scale = 1, byte;
    do { byte = buf[i++]; v += (byte & 0x7f) * scale; scale *= 128; } while (byte & 0x80);
    return v;
  };
  while (i < buf.length) {
    const key = varint(), wire = key & 7, field = Math.floor(key / 8);
    if (wire === 0) yield [field, varint()];
    else if (wire === 2) { const n = varint(); yield [field, buf.subarray(i, i + n)]; i += n; }
    else if (wire === 1 || wire === 5) i += wire === 1 ? 8 : 4;
    else throw new PackageError(`tokenizer.model: not a SentencePiece ModelProto (wire type ${wire})`);
  }
}

/** The piece strings and normalizer name of a SentencePiece `ModelProto`. */
function readModelProto(bytes) {
  const text = new TextDecoder();
  const pieces = [];
  let normalizer = null;
  for (const [field, value] of protoFields(bytes)) {
    if (field === 1) for (const [f, v] of protoFields(value)) { if (f === 1) pieces.push(text.decode(v)); }
    if (field === 3) for (const [f, v] of protoFields(value)) { if (f === 1) normalizer = text.decode(v); }
  }
  return {pieces, normalizer};
}

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/**
 * Refuse a manifest this client cannot read (spec, Versioning), before any file is used: the schema
 * version, the normalizer, the inputs, and file names that are not plain names listed in `files`.
 * Answers T, I, S and the input shapes, a `"batch"` axis taken as 1.
 */
export function checkManifest(manifest) {
  if (manifest.schema_version !== SCHEMA_VERSION) {
    throw new PackageError(`manifest.json: schema_version ${manifest.schema_version} is not ${SCHEMA_VERSION}`);
  }
  const tok = manifest.tokenizer;
  if (tok.type !== "sentencepiece" || tok.normalizer !== NORMALIZER) {
    throw new PackageError(`manifest.json: tokenizer ${tok.type}/${tok.normalizer} is not sentencepiece/${NORMALIZER}`);
  }
  if (!manifest.models.onnx) {
    throw new PackageError(`manifest.json: no onnx model (the package has ${Object.keys(manifest.models)})`);
  }
  for (const name of [manifest.schema, manifest.labels, tok.file, ...Object.values(manifest.models)]) {
    if (!/^(?!\.\.?$)[^/\\]+$/.test(name) || !(name in manifest.files)) {
      throw new PackageError(`manifest.json: ${JSON.stringify(name)} is not a file name listed in files`);
    }
  }
  const T = manifest.max_len, I = manifest.label_sets.intents, S = manifest.label_sets.slot_tags;
  const expected = [["input_ids", "int64", T], ["attention_mask", "int64", T], ["word_pos", "int64", T - 2],
    ["intent_mask", "bool", I], ["reject", "bool", 1]];
  const shapes = manifest.inputs.map((input, k) => {
    const [name, dtype, last] = expected[k];
    const shape = input.shape.map((d) => (d === "batch" ? 1 : d));
    if (input.name !== name || input.dtype !== dtype || shape.at(-1) !== last) {
      throw new PackageError(`manifest.json: inputs[${k}] is not ${name} ${dtype} ending in ${last}`);
    }
    return shape;
  });
  return {T, I, S, shapes};
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
 * Check a package and load its tokenizer. `manifest` and `labels` are the parsed JSON files,
 * `tokenizerBytes` the bytes of `tokenizer.model`, `session` an ONNX Runtime session on `model.onnx`
 * and `ort` the module it came from (for `ort.Tensor`). `SentencePieceProcessor` defaults to
 * `@sctg/sentencepiece-js`'s.
 */
export async function openPackage({manifest, labels, tokenizerBytes, ort, session, SentencePieceProcessor}) {
  const {T, I, S, shapes} = checkManifest(manifest);
  const tok = manifest.tokenizer;
  if (labels.intents.length !== I || (labels.slot_tags ?? []).length !== S) {
    throw new PackageError("labels.json: lists are not as long as manifest.json label_sets says");
  }
  const bytes = new Uint8Array(tokenizerBytes);
  const proto = readModelProto(bytes);
  if (proto.normalizer !== tok.normalizer) {
    throw new PackageError(`tokenizer.model: normalizer ${proto.normalizer} is not the manifest's ${tok.normalizer}`);
  }
  const specials = {pad: "<pad>", unk: "<unk>", cls: "[CLS]", sep: "[SEP]"};
  for (const [key, piece] of Object.entries(specials)) {
    if (proto.pieces[tok.special_ids[key]] !== piece) {
      throw new PackageError(`tokenizer.model: id ${tok.special_ids[key]} is not ${piece} (special_ids.${key})`);
    }
  }
  SentencePieceProcessor ??= (await import("@sctg/sentencepiece-js")).SentencePieceProcessor;
  const sp = new SentencePieceProcessor();
  await sp.loadFromB64StringModel(toBase64(bytes));
  return {manifest, labels, sp, ort, session, shapes, T, I, S};
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
    let pieces = sp.encodeIds(chars.slice(start, end).join(""));
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
 * Answer one utterance (spec, Answer): `{intent, confidence, slots, tags, truncated}`, with `tags`
 * only for packages with slots and `truncated` only when something was cut. `allowIntents` is null
 * (every intent) or a non-empty list of the package's intents; `reject` turns out-of-scope rejection on.
 */
export async function predict(pkg, text, {allowIntents = null, reject = true} = {}) {
  const {manifest, labels, ort, session, shapes, T, I, S} = pkg;
  const mask = new Uint8Array(I).fill(allowIntents === null ? 1 : 0);
  if (allowIntents !== null) {
    if (allowIntents.length === 0) throw new RangeError("allowIntents: an empty list allows no intent");
    for (const name of allowIntents) {
      const k = labels.intents.indexOf(name);
      if (k < 0) throw new RangeError(`allowIntents: unknown intent ${JSON.stringify(name)}`);
      mask[k] = 1;
    }
  }
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
    Uint8Array.of(reject ? 1 : 0),
  ];
  const feeds = {};
  manifest.inputs.forEach((input, k) => {
    feeds[input.name] = new ort.Tensor(input.dtype, data[k], shapes[k]);
  });
  // Nothing said (no word read, or zero-width and control characters only): no model call, the out-of-scope
  // answer with confidence 0 (spec); "O" for each word and no slots below
  const out = said ? await session.run(feeds) : null;

  const k = out ? Number(out.intent.data[0]) : I;
  const answer = {
    intent: k < I ? labels.intents[k] : manifest.decoding.oos_answer,
    confidence: out ? Number(out.confidence.data[0]) : 0,
    slots: [],
  };
  if (S > 0) {
    const tagIds = out?.tags.data;
    answer.tags = words.map((_, w) => (out && w < wordPos.length ? labels.slot_tags[Number(tagIds[w])] : "O"));
    answer.slots = groupSlots(answer.tags, words, chars);
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

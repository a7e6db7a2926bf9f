#!/usr/bin/env node
/**
 * `node cli.mjs PKG "text"` prints the one-line JSON of `edgekit predict PKG "text" --runtime onnx`.
 * `node cli.mjs PKG --file texts.txt` prints one line per input line, and on stderr the p50 latency
 * of predict() (tokenize + run + decode) after a warm-up.
 * Options: --allow-intents A,B   --no-reject   --threads N (ONNX Runtime threads, default 1)
 * It reads schema 4 packages only (client.mjs): a schema 2 or 3 package, or any package client.mjs refuses, exits 2
 * with `error: ` and the refusal's one line (docs/package-format.md R2).
 */
import {readFile, stat} from "node:fs/promises";
import {join} from "node:path";
import * as ort from "onnxruntime-node";
import {checkManifest, openPackage, parseJson, predict, sessionOptions, LABELS_BYTES, MANIFEST_BYTES, PackageError,
  InputError} from "./client.mjs";

const WARMUP = 20;

/** A package's JSON file, refused from its size before it is read (spec R3), then read strictly (parseJson). */
async function readJson(root, name, maxBytes) {
  const {size} = await stat(join(root, name));
  if (size > maxBytes) throw new PackageError(`${name}: ${size} bytes, more than the ${maxBytes} it may have`);
  return parseJson(await readFile(join(root, name)), name, maxBytes);
}

/** Open the package folder `root` on onnxruntime-node (a schema 4 package: checkManifest refuses any other). */
async function open(root, threads) {
  const manifest = await readJson(root, "manifest.json", MANIFEST_BYTES);
  checkManifest(manifest);
  const labels = await readJson(root, manifest.labels, LABELS_BYTES);
  const tokenizerBytes = await readFile(join(root, manifest.tokenizer.file));
  const session = await ort.InferenceSession.create(join(root, manifest.models.onnx),
    sessionOptions(manifest, {intraOpNumThreads: threads, interOpNumThreads: 1}));
  return openPackage({manifest, labels, tokenizerBytes, ort, session});
}

/** Python's `repr(float)`: shortest round-trip digits, exponent form below 1e-4 and from 1e16. */
function pyFloat(x) {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity";
  const [mantissa, exp] = x.toExponential().split("e");
  if (Number(exp) < -4 || Number(exp) >= 16) {
    return `${mantissa}e${exp[0]}${exp.slice(1).padStart(2, "0")}`;
  }
  return Number.isInteger(x) ? x.toFixed(1) : String(x);
}

/** Python's `json.dumps(value, ensure_ascii=False)`, `confidence` and `path_confidence` being the floats. */
function pyJson(value, key = null) {
  if (Array.isArray(value)) return `[${value.map((v) => pyJson(v)).join(", ")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pyJson(v, k)}`).join(", ")}}`;
  }
  return key === "confidence" || key === "path_confidence" ? pyFloat(value) : JSON.stringify(value);
}

/** The answer as `edgekit predict` prints it: without `tags`. */
function line(answer) {
  const {tags, ...printed} = answer;
  return pyJson(printed);
}

async function main(argv) {
  const args = {threads: 1, reject: true, allowIntents: null, file: null, positional: []};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--file") args.file = argv[++i];
    else if (a === "--allow-intents") args.allowIntents = argv[++i].split(",").filter((s) => s !== "");
    else if (a === "--no-reject") args.reject = false;
    else if (a === "--threads") args.threads = Number(argv[++i]);
    else args.positional.push(a);
  }
  const [root, text] = args.positional;
  if (root === undefined || (text === undefined) === (args.file === null)) {
    throw new InputError('usage: node cli.mjs PKG "text" | node cli.mjs PKG --file texts.txt');
  }
  const pkg = await open(root, args.threads);
  const options = {allowIntents: args.allowIntents, reject: args.reject};
  if (args.file === null) {
    const answer = await predict(pkg, text, options);
    console.log(line(answer));
    if (answer.truncated) {
      const {chars, words} = answer.truncated;
      console.error(`edgekit: input truncated to the package's ${pkg.T} pieces: the model saw its first ${words} ` +
        `words (up to character ${chars} of ${[...text].length})`);
    }
    return;
  }
  const texts = (await readFile(args.file, "utf8")).split(/\r?\n/);
  if (texts.at(-1) === "") texts.pop();
  for (let i = 0; i < Math.min(WARMUP, texts.length); i++) await predict(pkg, texts[i], options);
  const ms = [], out = [];
  for (const t of texts) {
    const t0 = performance.now();
    const answer = await predict(pkg, t, options);
    ms.push(performance.now() - t0);
    out.push(line(answer));
  }
  process.stdout.write(out.map((l) => l + "\n").join(""));
  ms.sort((a, b) => a - b);
  const p50 = ms.length ? ms[Math.floor((ms.length - 1) / 2)] : NaN;
  console.error(`p50 ${p50.toFixed(3)} ms per utterance (n=${ms.length}, warm-up ${Math.min(WARMUP, texts.length)}, ` +
    `${args.threads} thread${args.threads === 1 ? "" : "s"})`);
}

main(process.argv.slice(2)).catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(err instanceof PackageError || err instanceof InputError || err instanceof RangeError ? 2 : 1);
});

#!/usr/bin/env node
/**
 * `node compare-runtimes.mjs PKG texts.txt [MODEL.onnx]`: does this package answer the same in the browser?
 * Runs the package's ONNX model (or MODEL.onnx with the package's tokenizer and labels) on onnxruntime-node
 * (native) and onnxruntime-web (the browser's WASM kernels, here under Node), one thread each, and prints how
 * many answers differ: intents, slot lists, the largest confidence gap, and the mean ms per utterance of each.
 */
import {readFile} from "node:fs/promises";
import {join} from "node:path";
import * as ortNode from "onnxruntime-node";
import * as ortWeb from "onnxruntime-web/wasm";
import {checkManifest, openPackage, parseJson, predict, sessionOptions, LABELS_BYTES, MANIFEST_BYTES}
  from "./client.mjs";

const [root, file, model] = process.argv.slice(2);
const manifest = parseJson(await readFile(join(root, "manifest.json")), "manifest.json", MANIFEST_BYTES);
checkManifest(manifest);  // a schema 2 package is refused here, before the rest is read
const labels = parseJson(await readFile(join(root, manifest.labels)), manifest.labels, LABELS_BYTES);
const tokenizerBytes = await readFile(join(root, manifest.tokenizer.file));
const bytes = await readFile(model ?? join(root, manifest.models.onnx));
ortWeb.env.wasm.numThreads = 1;
const open = async (ort, options) => openPackage({manifest, labels, tokenizerBytes, ort,
  session: await ort.InferenceSession.create(bytes, sessionOptions(manifest, options))});
const native = await open(ortNode, {intraOpNumThreads: 1, interOpNumThreads: 1});
const wasm = await open(ortWeb, {executionProviders: ["wasm"]});
const texts = (await readFile(file, "utf8")).split(/\r?\n/).filter((t) => t !== "");
const out = {n: texts.length, intents_differ: 0, slots_differ: 0, max_confidence_gap: 0, ms_node: 0, ms_web: 0};
for (const t of texts) {
  let t0 = performance.now();
  const a = await predict(native, t);
  out.ms_node += (performance.now() - t0) / texts.length;
  t0 = performance.now();
  const b = await predict(wasm, t);
  out.ms_web += (performance.now() - t0) / texts.length;
  out.intents_differ += a.intent !== b.intent;
  out.slots_differ += JSON.stringify(a.slots) !== JSON.stringify(b.slots);
  out.max_confidence_gap = Math.max(out.max_confidence_gap, Math.abs(a.confidence - b.confidence));
}
console.log(JSON.stringify(out));

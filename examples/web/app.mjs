/**
 * The page: every keystroke runs the package in this tab (onnxruntime-web, WASM) and shows the intent, its
 * confidence, the whole answer's confidence (path_confidence), the slots highlighted in the text and the latency.
 * `edgekit web PKG` serves this folder with the package under ./pkg/. Once loaded it needs no network (sw.js keeps
 * every file it fetched). It reads schema 4 packages only (client.mjs): a schema 2 or 3 package is refused, with
 * the spec's line shown in the status bar.
 */
import * as ort from "onnxruntime-web/wasm";
import {SentencePieceProcessor} from "@sctg/sentencepiece-js";
import {checkManifest, openPackage, parseJson, predict, sessionOptions, LABELS_BYTES, MANIFEST_BYTES}
  from "./client.mjs";

const $ = (id) => document.getElementById(id);
const PKG = "pkg/";

async function fetchOk(name) {
  const response = await fetch(PKG + name);
  if (!response.ok) throw new Error(`${PKG}${name}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function load() {
  ort.env.wasm.wasmPaths = new URL("./", import.meta.url).href;  // the .wasm beside this bundle, never a CDN
  ort.env.wasm.numThreads = 1;  // one core, as an app's foreground call on the phone
  // The JSON files read strictly from their bytes (spec R3: response.json() would drop a byte-order mark and keep
  // the last of a repeated key), and the manifest checked (a schema 2 or 3 package refused, R2) before another fetch
  const manifest = parseJson(await fetchOk("manifest.json"), "manifest.json", MANIFEST_BYTES);
  checkManifest(manifest);
  const labels = parseJson(await fetchOk(manifest.labels), manifest.labels, LABELS_BYTES);
  const tokenizerBytes = await fetchOk(manifest.tokenizer.file);
  const session = await ort.InferenceSession.create(await fetchOk(manifest.models.onnx),
    sessionOptions(manifest, {executionProviders: ["wasm"]}));
  return openPackage({manifest, labels, tokenizerBytes, ort, session, SentencePieceProcessor});
}

/** The text with each slot's characters wrapped in a <mark> (spans are code points; JS strings are UTF-16). */
function highlight(text, slots) {
  const chars = Array.from(text), out = document.createDocumentFragment();
  let at = 0;
  for (const s of slots) {
    if (s.start > at) out.append(chars.slice(at, s.start).join(""));
    const mark = document.createElement("mark");
    mark.dataset.slot = s.slot;
    mark.title = s.slot;
    mark.append(chars.slice(s.start, s.end).join(""));
    const tag = document.createElement("sub");
    tag.textContent = s.slot;
    mark.append(tag);
    out.append(mark);
    at = s.end;
  }
  out.append(chars.slice(at).join(""));
  return out;
}

function render(text, answer, ms) {
  $("intent").textContent = answer.intent;
  $("confidence").textContent = answer.confidence.toFixed(3);
  $("path").textContent = answer.path_confidence === undefined ? "–" : answer.path_confidence.toFixed(3);
  $("latency").textContent = `${ms.toFixed(1)} ms`;
  $("text").replaceChildren(highlight(text, answer.slots));
  $("slots").replaceChildren(...answer.slots.map((s) => {
    const row = document.createElement("tr");
    for (const v of [s.slot, s.value]) row.append(Object.assign(document.createElement("td"), {textContent: v}));
    return row;
  }));
  $("truncated").hidden = !answer.truncated;
  // What a test reads back: the answer (as `edgekit predict` prints it) and the text it answers.
  const {tags, ...printed} = answer;
  $("answer").textContent = JSON.stringify(printed);
  $("answer").dataset.text = text;
}

async function main() {
  if ("serviceWorker" in navigator) navigator.serviceWorker.register("sw.js").catch(() => {});
  let pkg;
  try {
    pkg = await load();
  } catch (err) {
    $("status").textContent = `could not load the package: ${err.message}`;
    $("status").className = "error";
    return;
  }
  const {manifest, I} = pkg;
  const ready = `${manifest.profile} package · ${I} intents · ${manifest.label_sets.slot_tags} slot ` +
    `tags · onnxruntime-web ${ort.env.versions.web} (WASM) · runs in this tab`;
  $("status").textContent = ready;
  const box = $("input");
  let busy = false, pending = false;
  async function update() {  // one prediction at a time; keystrokes during one are answered by the next
    if (busy) { pending = true; return; }
    busy = true;
    try {
      do {
        pending = false;
        const text = box.value;
        try {
          const t0 = performance.now();
          const answer = await predict(pkg, text);
          render(text, answer, performance.now() - t0);
          Object.assign($("status"), {textContent: ready, className: ""});
        } catch (err) {  // e.g. a lone surrogate (InputError): say so; a keystroke typed meanwhile is still answered
          Object.assign($("status"), {textContent: `no answer: ${err.message}`, className: "error"});
        }
      } while (pending);
    } finally {
      busy = false;
    }
  }
  box.addEventListener("input", update);
  box.disabled = false;
  box.focus();
  document.body.dataset.ready = "true";
  if (box.value) update();
}

main();

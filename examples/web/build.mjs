// `npm run build`: bundle the page (app.mjs, client.mjs, SentencePiece, onnxruntime-web) into dist/, with
// onnxruntime-web's WASM files beside it, so that the page loads nothing from outside this folder.
import {build} from "esbuild";
import {copyFileSync, mkdirSync, writeFileSync} from "node:fs";

mkdirSync("dist", {recursive: true});
writeFileSync("dist/empty.mjs", "export {};\n");
await build({
  entryPoints: ["app.mjs"], bundle: true, format: "esm", platform: "browser", target: "es2022", minify: true,
  outfile: "dist/app.js", logLevel: "warning",
  // @sctg/sentencepiece-js imports Node's fs at its top level (for its load(path), which the page never calls) and
  // `module` in its Node-only branch
  alias: {fs: "./dist/empty.mjs", module: "./dist/empty.mjs"},
});
for (const f of ["ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs"]) {
  copyFileSync(`node_modules/onnxruntime-web/dist/${f}`, `dist/${f}`);
}
console.log("dist/app.js and onnxruntime-web's WASM written");

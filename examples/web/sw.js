// Offline once loaded: at install, the page and what it reads of the package (manifest, labels, tokenizer and
// the ONNX model; not an ExecuTorch program the package may also hold) are kept;
// a request the network cannot answer is answered from there. Network first, so a rebuilt package at the same
// URLs replaces the kept copy whenever the server is reachable.
const CACHE = "edgekit-web-v1";
const PAGE = ["./", "index.html", "dist/app.js", "dist/ort-wasm-simd-threaded.mjs", "dist/ort-wasm-simd-threaded.wasm"];

self.addEventListener("install", (event) => event.waitUntil((async () => {
  const manifest = await (await fetch("pkg/manifest.json", {cache: "no-store"})).json();
  const cache = await caches.open(CACHE);
  const read = [manifest.labels, manifest.tokenizer.file, manifest.models.onnx];
  await cache.addAll([...PAGE, "pkg/manifest.json", ...read.map((f) => `pkg/${f}`)]);
  await self.skipWaiting();
})()));
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (event) => {
  if (event.request.method !== "GET") return;
  event.respondWith((async () => {
    let response;
    try {
      response = await fetch(event.request);
    } catch (err) {
      const kept = await (await caches.open(CACHE)).match(event.request, {ignoreSearch: true});
      if (kept) return kept;
      throw err;
    }
    // a cache that cannot be written (quota, private mode) must not cost the answer the network gave
    if (response.ok) event.waitUntil(caches.open(CACHE).then((c) => c.put(event.request, response.clone())).catch(() => {}));
    return response;
  })());
});

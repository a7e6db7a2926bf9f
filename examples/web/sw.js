// Offline once loaded: at install, the page and the package (manifest.json and every file it lists) are kept;
// a request the network cannot answer is answered from there. Network first, so a rebuilt package at the same
// URLs replaces the kept copy whenever the server is reachable.
const CACHE = "edgekit-web-v1";
const PAGE = ["./", "index.html", "dist/app.js", "dist/ort-wasm-simd-threaded.mjs", "dist/ort-wasm-simd-threaded.wasm"];

self.addEventListener("install", (event) => event.waitUntil((async () => {
  const manifest = await (await fetch("pkg/manifest.json", {cache: "no-store"})).json();
  const cache = await caches.open(CACHE);
  await cache.addAll([...PAGE, "pkg/manifest.json", ...Object.keys(manifest.files).map((f) => `pkg/${f}`)]);
  await self.skipWaiting();
})()));
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (event) => {
  if (event.request.method !== "GET") return;
  event.respondWith((async () => {
    const cache = await caches.open(CACHE);
    try {
      const response = await fetch(event.request);
      if (response.ok) await cache.put(event.request, response.clone());
      return response;
    } catch (err) {
      const kept = await cache.match(event.request, {ignoreSearch: true});
      if (kept) return kept;
      throw err;
    }
  })());
});

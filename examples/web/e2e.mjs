#!/usr/bin/env node
/**
 * `node e2e.mjs URL texts.txt [web.png]`: drive the page served by `edgekit web` in headless Chromium (Debian's
 * /usr/bin/chromium, or $CHROMIUM), type each line of texts.txt key by key, and print one JSON line per text: the
 * answer the page rendered for it. Then, with the network off, reload the page (sw.js answers) and type the first
 * text again: the last line is that answer, marked "offline". The screenshot shows the first text's answer.
 */
import {readFile} from "node:fs/promises";
import {mkdtempSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";
import {chromium} from "playwright-core";

const [url, file, shot = "web.png"] = process.argv.slice(2);
const texts = (await readFile(file, "utf8")).split(/\r?\n/).filter((t) => t !== "");
// Flags as for any headless Chromium on a machine with no outside network: no background connections. The profile
// is a fresh folder, removed on exit whatever happens (one was left in the temp folder per run).
const profile = mkdtempSync(join(tmpdir(), "edgekit-chromium-"));
process.on("exit", () => rmSync(profile, {recursive: true, force: true}));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true, viewport: {width: 900, height: 560},
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const page = context.pages()[0] ?? await context.newPage();
const errors = [];
page.on("pageerror", (e) => errors.push(e.message));

async function ready() {
  await page.waitForSelector("body[data-ready=true]", {timeout: 60000}).catch(async () => {
    throw new Error(`the page did not load: ${await page.textContent("#status")} ${errors.join("; ")}`);
  });
}

/** Type `text` into an empty box key by key; answer what the page shows once it answers this exact text. */
async function type(text) {
  const box = page.locator("#input");
  await box.fill("");
  await box.pressSequentially(text);
  await page.waitForFunction((t) => document.getElementById("answer").dataset.text === t, text, {timeout: 30000});
  return JSON.parse(await page.textContent("#answer"));
}

await page.goto(url);
await ready();
await page.evaluate(() => Promise.race([navigator.serviceWorker.ready,  // installed: page and package are kept
  new Promise((_, reject) => setTimeout(() => reject(new Error("sw.js did not install within 60 s")), 60000))]));
const out = [];
for (const text of texts) out.push({text, answer: await type(text)});
await type(texts[0]);
await page.screenshot({path: shot});
await context.setOffline(true);
await page.reload();
await ready();
out.push({text: texts[0], answer: await type(texts[0]), offline: true});
await context.close();
for (const row of out) console.log(JSON.stringify(row));
if (errors.length) { console.error(`page errors: ${errors.join("; ")}`); process.exit(1); }

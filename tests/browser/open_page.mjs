// Open local HTML pages in Debian's Chromium and print what each one ran and showed, as one JSON line (a list,
// one entry per page, in order); tests/test_browser.py's hostile-snapshot test asserts on it.
//
//   node open_page.mjs --page /tmp/report.html [--page /tmp/explorer.html ...] [--chromium /usr/bin/chromium]
//
// Per page: `pwned` (window.__pwned once the page settled, as text; null while nothing set it), `dialogs`
// (the messages of any alert, confirm or prompt), `page_errors`, `text` (the body's innerText: what a
// reader sees), `plots` (plotly plots rendered), `plot_text` (their SVG text: titles, legends, ticks) and
// `hover_text` (the hover label of each trace's first point). Exit status 0 whenever it could report.

import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';

const { values: opt } = parseArgs({
  options: {
    page: { type: 'string', multiple: true, default: [] },
    chromium: { type: 'string', default: '/usr/bin/chromium' },
    timeout: { type: 'string', default: '60' }, // seconds per page
  },
});
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'];
const SETTLE_MS = 1000; // after load: an <img onerror> fires once its load has failed, a moment later

async function visit(browser, path) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const seen = { page: path, dialogs: [], page_errors: [] };
  page.on('dialog', (d) => {
    seen.dialogs.push(d.message());
    d.dismiss().catch(() => null);
  });
  page.on('pageerror', (e) => seen.page_errors.push(String(e).slice(0, 500)));
  try {
    await page.goto(pathToFileURL(path).href, { waitUntil: 'load', timeout: Number(opt.timeout) * 1000 });
    await page.waitForTimeout(SETTLE_MS);
    Object.assign(
      seen,
      await page.evaluate(async () => {
        const plots = [...document.querySelectorAll('.js-plotly-plot')];
        const hover_text = [];
        for (const gd of plots) {
          for (let i = 0; window.Plotly && i < (gd.data || []).length; i++) {
            window.Plotly.Fx.hover(gd, [{ curveNumber: i, pointNumber: 0 }]);
            await new Promise((r) => setTimeout(r, 100)); // plotly throttles hover events
            const layer = gd.querySelector('.hoverlayer');
            hover_text.push(layer ? layer.textContent : '');
          }
        }
        return {
          pwned: typeof window.__pwned === 'undefined' ? null : String(window.__pwned),
          text: document.body.innerText,
          plots: plots.filter((gd) => gd.querySelector('.main-svg')).length,
          plot_text: plots.flatMap((gd) => [...gd.querySelectorAll('.main-svg text')].map((t) => t.textContent)),
          hover_text,
        };
      }),
    );
  } catch (e) {
    seen.driver_error = String(e && e.stack ? e.stack : e);
  } finally {
    await context.close();
  }
  return seen;
}

async function main() {
  const browser = await chromium.launch({ executablePath: opt.chromium, args: CHROMIUM_ARGS });
  const pages = [];
  try {
    for (const path of opt.page) pages.push(await visit(browser, path));
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(pages) + '\n');
}

main();

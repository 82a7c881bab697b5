// Open one notebook in JupyterLab in Debian's Chromium, run all its cells, move its main control,
// and print what the page showed as one JSON line; tests/test_browser.py asserts on it: the text of every
// output (`text`), the controls it has, and the text and figures of the main control's cell before and
// after the control moved (`control_text`, `control_text_after`, `figure_changed`).
//
//   node run_notebook.mjs --base http://127.0.0.1:PORT --token TOKEN --notebook 01_start_here.ipynb \
//        --screenshots ../../build/screenshots [--expect-plot] [--chromium /usr/bin/chromium] [--timeout 240]
//
// Per code cell (`cells`): its seconds, from the moment the cell before it finished (or Run All began) to its own
// prompt number, looked at every 200 ms, and whether its output showed a progress widget with a time while it ran;
// the test requires that on every cell slower than tests/test_notebooks.py's SLOW_CELL.
//
// Screenshots: SCREENSHOTS/<stem>.png (the whole notebook after the run: the viewport is made as tall
// as the notebook), <stem>_control.png (the outputs of the cell holding the `kit-main-control`: the
// control and its figures), <stem>_after.png and <stem>_control_after.png (the same after moving the
// control), and <stem>_error.png if the driver gave up. Exit status 0 whenever it could report; a driver failure
// (Lab not loading, a timeout) is reported as "driver_error" and exits 1.

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';

const { values: opt } = parseArgs({
  options: {
    base: { type: 'string' },
    token: { type: 'string' },
    notebook: { type: 'string' },
    screenshots: { type: 'string' },
    'expect-plot': { type: 'boolean', default: false }, // wait for a plotly plot to render
    chromium: { type: 'string', default: '/usr/bin/chromium' },
    timeout: { type: 'string', default: '240' }, // seconds for the whole notebook
  },
});
const stem = opt.notebook.replace(/\.ipynb$/, '');
const started = Date.now();
const deadline = started + Number(opt.timeout) * 1000;
const remaining = (cap) => Math.max(1000, Math.min(cap, deadline - Date.now()));
const log = (msg) => process.stderr.write(`[${((Date.now() - started) / 1000).toFixed(1)}s ${stem}] ${msg}\n`);

const WIDTH = 1400; // a laptop's browser window, the file browser collapsed
const MAX_HEIGHT = 16000; // tallest full-notebook screenshot
const PANEL = '.jp-NotebookPanel:not(.lm-mod-hidden)'; // the notebook on screen
const NOTEBOOK = `${PANEL} .jp-Notebook`;
const SCROLLER = `${PANEL} .jp-WindowedPanel-outer`;
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox', // CI runs as root
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];
// Error text in an output: a traceback, or a line that starts with an exception's name (`ValueError: ...`).
// Library warnings that merely mention one mid-line (vLLM's "Failed to import from vllm._C:
// ModuleNotFoundError(...)" on CPU) are reported as warnings, not errors.
const ERROR_RE = /Traceback|^\s*([\w.]+\.)?[A-Z]\w*(Error|Exception)\b/m;
// The widget views a person operates, by ipywidgets 8's classes.
const CONTROL_CLASSES = [
  'widget-toggle-buttons',
  'widget-slider',
  'widget-dropdown',
  'widget-checkbox',
  'widget-text',
  'widget-button',
  'widget-upload',
  'widget-select',
];

/** Wait until `fn()` returns a truthy value (polled), or throw after `ms` naming `what`. */
async function until(fn, ms, what, every = 250) {
  const end = Date.now() + ms;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out after ${Math.round(ms / 1000)} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

/** Whether the server has a session for this notebook whose kernel is idle with the page connected. */
async function kernelReady() {
  const response = await fetch(`${opt.base}/api/sessions`, { headers: { Authorization: `token ${opt.token}` } });
  if (!response.ok) return false;
  const session = (await response.json()).find((s) => s.path === opt.notebook);
  return Boolean(session && session.kernel.execution_state === 'idle' && session.kernel.connections > 0);
}

/** The kernel's state as the notebook shows it: cell prompts and the toolbar's execution indicator. */
async function executionState(page) {
  return page.evaluate(
    ({ NOTEBOOK, PANEL }) => {
      const prompts = [...document.querySelectorAll(`${NOTEBOOK} .jp-CodeCell .jp-InputPrompt`)].map((p) =>
        p.textContent.trim(),
      );
      const indicator = document.querySelector(`${PANEL} .jp-Notebook-ExecutionIndicator`);
      return {
        running: prompts.filter((p) => p.includes('[*]')).length,
        executed: prompts.filter((p) => /\[\d+\]/.test(p)).length,
        code_cells: prompts.length,
        indicator: indicator ? indicator.getAttribute('data-status') : null,
      };
    },
    { NOTEBOOK, PANEL },
  );
}

/** Per code cell: whether it shows its prompt number yet, and whether its output shows a progress widget with a
 *  time in it now (kit.progress's bars close when their work ends, so they are looked for while cells run). */
async function cellStates(page) {
  return page.evaluate(
    (NOTEBOOK) =>
      [...document.querySelectorAll(`${NOTEBOOK} .jp-CodeCell`)].map((cell) => {
        const prompt = cell.querySelector('.jp-InputPrompt');
        const out = cell.querySelector('.jp-OutputArea');
        const bar = out && out.querySelector('.widget-progress, .widget-hprogress, progress');
        const line = cell.querySelector('.cm-line');
        return {
          numbered: Boolean(prompt) && /\[\d+\]/.test(prompt.textContent),
          progress: Boolean(bar) && /\d\d:\d\d/.test(out.textContent),
          first_line: line ? line.textContent.slice(0, 80) : '',
        };
      }),
    NOTEBOOK,
  );
}

/** Fold one look at the cells into what was seen so far: when each got its number, whether it showed progress. */
async function watchCells(page, seen) {
  const now = Date.now();
  return (await cellStates(page)).map((state, i) => ({
    numbered_at: seen[i]?.numbered_at ?? (state.numbered ? now : null),
    progress: Boolean(seen[i]?.progress) || state.progress,
    first_line: state.first_line,
  }));
}

/** The content of every plotly figure in the notebook: traces and layout, less the page-size parts. */
async function plotSignature(page) {
  return page.evaluate((NOTEBOOK) => {
    const plots = [...document.querySelectorAll(`${NOTEBOOK} .js-plotly-plot`)];
    return JSON.stringify(
      plots.map((gd) => {
        const layout = { ...(gd.layout || {}) };
        for (const key of Object.keys(layout)) {
          if (key.startsWith('_') || ['width', 'height', 'autosize'].includes(key)) delete layout[key];
        }
        return { data: gd.data || null, layout };
      }),
    );
  }, NOTEBOOK);
}

/** Wait until the figures stop changing (plotly relayouts after a resize); returns their signature. */
async function settledSignature(page) {
  let last = await plotSignature(page);
  await until(
    async () => {
      await page.waitForTimeout(500);
      const now = await plotSignature(page);
      const same = now === last;
      last = now;
      return same;
    },
    remaining(10000),
    'the figures to stop changing',
  ).catch((e) => log(String(e)));
  return last;
}

/** Wait until the main control's cell text stops changing (its widgets update one message at a time). */
async function settledText(page) {
  let last = await controlText(page);
  await until(
    async () => {
      await page.waitForTimeout(500);
      const now = await controlText(page);
      const same = now === last;
      last = now;
      return same;
    },
    remaining(10000),
    'the text to stop changing',
  ).catch((e) => log(String(e)));
  return last;
}

/** Make the viewport as tall as the notebook so that a page screenshot shows all of it. */
async function fitViewportToNotebook(page) {
  const extra = await page.evaluate((SCROLLER) => {
    const scroller = document.querySelector(SCROLLER);
    return scroller ? scroller.scrollHeight - scroller.clientHeight : 0;
  }, SCROLLER);
  const height = Math.min(MAX_HEIGHT, page.viewportSize().height + extra + 20);
  await page.setViewportSize({ width: WIDTH, height });
  await page.evaluate((SCROLLER) => {
    const scroller = document.querySelector(SCROLLER);
    if (scroller) scroller.scrollTop = 0;
  }, SCROLLER);
  return height;
}

/** What the notebook shows: error outputs, widget views, plotly plots, the main control. */
async function survey(page) {
  return page.evaluate(
    ({ NOTEBOOK, errorSource, CONTROL_CLASSES }) => {
      const nb = document.querySelector(NOTEBOOK);
      const errorRe = new RegExp(errorSource);
      const errors = [];
      const warnings = [];
      for (const el of nb.querySelectorAll('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')) {
        (errorRe.test(el.textContent) ? errors : warnings).push(el.textContent.slice(0, 2000));
      }
      // A widget whose model or view failed renders as a message, not as a view.
      for (const el of nb.querySelectorAll('.jp-OutputArea-output')) {
        if (/Error displaying widget|Failed to load model class|Model not found/i.test(el.textContent)) {
          errors.push(el.textContent.slice(0, 500));
        }
      }
      const kind = (el) =>
        el.classList.contains('widget-toggle-buttons')
          ? 'ToggleButtons'
          : el.classList.contains('widget-slider')
            ? 'IntSlider'
            : el.classList.contains('widget-dropdown')
              ? 'Dropdown'
              : [...el.classList].join(' ');
      // Every widget a person can operate: a notebook with any of them must mark one as its main control.
      const selector = CONTROL_CLASSES.map((c) => `.jp-OutputArea-output .${c}`).join(', ');
      const operable = [...nb.querySelectorAll(selector)].map((el) =>
        CONTROL_CLASSES.find((c) => el.classList.contains(c)),
      );
      return {
        errors,
        warnings,
        widget_views: nb.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length,
        plotly_plots: nb.querySelectorAll('.js-plotly-plot').length,
        plotly_svgs: nb.querySelectorAll('.js-plotly-plot .main-svg').length,
        controls: [...nb.querySelectorAll('.kit-main-control')].map((el) => ({
          kind: kind(el),
          text: el.textContent.trim().slice(0, 200),
        })),
        control_widgets: operable,
        // Each plotly plot's width against its output area's, whether its legend scrolls (entries hidden
        // until scrolled) and whether its title runs past the plot's edges (cut off).
        plots: [...nb.querySelectorAll('.js-plotly-plot')].map((gd) => {
          // The drawing, not its <div>: the div is as wide as the cell whatever width plotly drew at.
          const svg = gd.querySelector('.main-svg');
          const box = (svg || gd).getBoundingClientRect();
          const area = gd.closest('.jp-OutputArea-output');
          const title = gd.querySelector('.gtitle');
          const scrollbar = gd.querySelector('.legend .scrollbar');
          const titleBox = title ? title.getBoundingClientRect() : null;
          return {
            title: title ? title.textContent.slice(0, 100) : '',
            width: Math.round(box.width),
            area_width: area ? Math.round(area.getBoundingClientRect().width) : null,
            legend_scrolls: Boolean(scrollbar && scrollbar.getBoundingClientRect().height > 0),
            title_cut: Boolean(titleBox && (titleBox.right > box.right + 1 || titleBox.left < box.left - 1)),
          };
        }),
      };
    },
    { NOTEBOOK, errorSource: ERROR_RE.source, CONTROL_CLASSES },
  );
}

/** The text of every output of the notebook, in page order (what a reader sees, widgets and plots included). */
async function outputText(page) {
  return page.evaluate((NOTEBOOK) => {
    const outputs = document.querySelectorAll(`${NOTEBOOK} .jp-OutputArea-output`);
    return [...outputs].map((el) => el.textContent).join('\n');
  }, NOTEBOOK);
}

/** The text of the outputs of the cell holding the main control. */
async function controlText(page) {
  return page.evaluate((NOTEBOOK) => {
    const cell = document.querySelector(`${NOTEBOOK} .jp-Cell-outputWrapper:has(.kit-main-control)`);
    return cell ? cell.textContent : '';
  }, NOTEBOOK);
}

/** Move the main control one step, as a person would; returns what was done. */
async function moveControl(page) {
  const control = page.locator(`${NOTEBOOK} .kit-main-control`).first();
  if (await control.evaluate((el) => el.classList.contains('widget-dropdown'))) {
    const select = control.locator('select');
    const options = await select.locator('option').allTextContents();
    const index = await select.evaluate((el) => el.selectedIndex);
    const next = (index + 1) % options.length;
    await select.selectOption({ index: next });
    return `selected "${options[next].trim()}"`;
  }
  if (await control.evaluate((el) => el.classList.contains('widget-toggle-buttons'))) {
    const choice = control.locator('button:not(.mod-active)').first();
    const label = (await choice.textContent()).trim();
    await choice.click();
    return `clicked "${label}"`;
  }
  // A slider: the arrow keys on its handle; the other way if it is at its maximum.
  const readout = control.locator('.widget-readout');
  const handle = control.locator('.noUi-handle').first();
  const before = (await readout.textContent()).trim();
  for (const key of ['ArrowRight', 'ArrowLeft']) {
    await handle.focus();
    await page.keyboard.press(key);
    const after = await until(
      async () => {
        const now = (await readout.textContent()).trim();
        return now !== before ? now : null;
      },
      2000,
      'the slider to move',
    ).catch(() => null);
    if (after !== null) return `slider ${before} -> ${after} (${key})`;
  }
  return `slider did not move from ${before}`;
}

async function runAllCells(page) {
  // Run > Run All Cells; once more if no cell started (a kernel still settling). Returns each code cell's seconds.
  const runStart = Date.now();
  let seen = [];
  for (let attempt = 1; ; attempt++) {
    await page.locator('.lm-MenuBar-item', { hasText: /^Run$/ }).click();
    await page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click();
    const started = await until(
      async () => {
        const s = await executionState(page);
        return s.executed > 0 || s.running > 0;
      },
      remaining(20000),
      'the first cell to run',
    ).catch((e) => (attempt < 3 ? null : Promise.reject(e)));
    if (started) break;
    log(`run all: no cell started (attempt ${attempt})`);
  }
  await until(
    async () => {
      seen = await watchCells(page, seen);
      const s = await executionState(page);
      return s.running === 0 && s.indicator === 'idle';
    },
    remaining(Number(opt.timeout) * 1000),
    'every cell to finish',
    200,
  );
  seen = await watchCells(page, seen);
  return seen.map((cell, i) => ({
    seconds: cell.numbered_at === null ? null : (cell.numbered_at - (i ? seen[i - 1].numbered_at : runStart)) / 1000,
    progress: cell.progress,
    first_line: cell.first_line,
  }));
}

async function main() {
  mkdirSync(opt.screenshots, { recursive: true });
  const browser = await chromium.launch({ executablePath: opt.chromium, args: CHROMIUM_ARGS });
  const page = await browser.newPage({ viewport: { width: WIDTH, height: 900 } });
  const report = { notebook: opt.notebook, console_errors: [] };
  page.on('pageerror', (e) => report.console_errors.push(String(e).slice(0, 500)));
  try {
    // A workspace of its own, reset: only this notebook open, nothing restored from an earlier run.
    const workspace = `kit-browser-test-${stem}`;
    const path = `/lab/workspaces/${workspace}/tree/${encodeURIComponent(opt.notebook)}`;
    await page.goto(`${opt.base}${path}?reset&token=${opt.token}`, { timeout: remaining(90000) });
    await page.locator(`${NOTEBOOK} .jp-Cell`).first().waitFor({ timeout: remaining(90000) });
    await until(kernelReady, remaining(120000), 'the notebook kernel to start and connect', 500);
    await until(async () => (await executionState(page)).indicator === 'idle', remaining(30000), 'an idle kernel');
    log('notebook open, kernel idle');
    // Collapse the file browser so that the notebook has the page's width.
    const leftTab = page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current');
    if (await leftTab.count()) await leftTab.first().click();

    const runStart = Date.now();
    report.cells = await runAllCells(page);
    report.run_seconds = (Date.now() - runStart) / 1000;
    report.execution = await executionState(page);
    log(`all cells ran in ${report.run_seconds} s`);

    // Widget views and plots render after their cells finish.
    await until(
      async () => {
        const s = await survey(page);
        return s.widget_views > 0 && (!opt['expect-plot'] || s.plotly_svgs > 0);
      },
      remaining(30000),
      'widget views and plots to render',
    ).catch((e) => log(String(e)));
    // Plot sizes as a person first sees them: a window resize (the next step) refits responsive plots.
    await page.waitForTimeout(1000);
    const firstPlots = (await survey(page)).plots;
    report.viewport_height = await fitViewportToNotebook(page);
    const before = await settledSignature(page);
    Object.assign(report, await survey(page));
    report.plots = firstPlots;
    report.text = await outputText(page);
    await page.screenshot({ path: join(opt.screenshots, `${stem}.png`), fullPage: true });
    if (!report.controls.length) return;

    const controlOutputs = page.locator(`${NOTEBOOK} .jp-Cell-outputWrapper:has(.kit-main-control)`).first();
    await controlOutputs.screenshot({ path: join(opt.screenshots, `${stem}_control.png`) });
    report.control_text = await controlText(page);
    report.moved = await moveControl(page);
    const t0 = Date.now();
    await until(
      async () => (await plotSignature(page)) !== before || (await controlText(page)) !== report.control_text,
      remaining(15000),
      'a figure or the text to change',
    ).catch(() => null);
    report.change_seconds = (Date.now() - t0) / 1000;
    // The text may change first: give a busy machine's figure a few seconds more to follow.
    await until(async () => (await plotSignature(page)) !== before, remaining(5000), 'a figure to change').catch(
      () => null,
    );
    report.figure_changed = (await settledSignature(page)) !== before;
    report.control_text_after = await settledText(page);
    log(`moved: ${report.moved}; figure changed: ${report.figure_changed} (${report.change_seconds} s)`);
    report.errors_after = (await survey(page)).errors;
    await page.screenshot({ path: join(opt.screenshots, `${stem}_after.png`), fullPage: true });
    await controlOutputs.screenshot({ path: join(opt.screenshots, `${stem}_control_after.png`) });
  } catch (e) {
    report.driver_error = String(e && e.stack ? e.stack : e);
    const dialog = await page.locator('.jp-Dialog').first().textContent({ timeout: 1000 }).catch(() => null);
    if (dialog) report.dialog = dialog.slice(0, 1000);
    await page.screenshot({ path: join(opt.screenshots, `${stem}_error.png`) }).catch(() => null);
  } finally {
    await browser.close();
    report.seconds = (Date.now() - started) / 1000;
    process.stdout.write(JSON.stringify(report) + '\n');
  }
  process.exit(report.driver_error ? 1 : 0);
}

main();

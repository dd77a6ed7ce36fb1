#!/usr/bin/env node
// Builds a baton processor written in JavaScript into a WebAssembly component:
//
//   node guest-sdk/js/build.mjs --entry processor.js --wit wit --out processor.wasm
//
// 1. esbuild bundles the entry with this SDK (`baton-sdk`, `baton-sdk/windows`) and anything
//    else it imports into one ES module; the `baton:processor/...` imports stay external.
// 2. componentize-js makes that module a component of the world `processor` of the WIT in
//    `--wit`, exporting `baton:processor/handler@0.2.0`.
//
// The tools come from `$BATON_JS_TOOLS/node_modules` (default `~/.cache/baton/js/node_modules`),
// installed from guest-sdk/js/tools:
//
//   mkdir -p ~/.cache/baton/js && cp guest-sdk/js/tools/package*.json ~/.cache/baton/js/ \
//     && npm ci --prefix ~/.cache/baton/js

import { createRequire } from "node:module";
import { existsSync, readFileSync, statSync } from "node:fs";
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir, homedir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const SDK = dirname(fileURLToPath(import.meta.url));
const FEATURES = ["stdio", "random", "clocks", "http", "fetch-event"];
// A processor talks to the host only through the baton interfaces. stdio stays (the host keeps
// the guest's stderr to explain traps), and so do clocks and random (the host gives every guest
// deterministic ones unless the pipeline grants real ones); nothing provides wasi:http.
const DEFAULT_DISABLE = ["http", "fetch-event"];

const USAGE = `usage: node build.mjs --entry <processor.js> --wit <wit dir> --out <component.wasm>
  [--world processor] [--sdk <dir of baton-sdk>] [--disable <feature,...>|none|all]
  [--bundle-out <file.js>] [--minify]
       node build.mjs --plugin <dir> [--out <component.wasm>] [...]

  --plugin   a plugin directory whose package.json has "baton": {"entry", "sdk", "wit"}
             (relative to it); --out defaults to <dir>/target/<name>.wasm
  --entry    the processor module (.js, .mjs or .ts); it exports \`handler\`
  --sdk      the baton-sdk that \`import ... from "baton-sdk"\` means (default: this one)

  --disable  WASI features of the JS engine to leave out, of ${FEATURES.join(", ")}
             (default: ${DEFAULT_DISABLE.join(",")}; "all" leaves out every one: no WASI imports)
  Tools: $BATON_JS_TOOLS/node_modules (default ~/.cache/baton/js/node_modules).`;

function fail(msg) {
  console.error(`baton js build: ${msg}`);
  process.exit(1);
}

function parseArgs(argv) {
  const opts = { world: "processor", sdk: SDK, disable: DEFAULT_DISABLE, minify: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${a} needs a value\n${USAGE}`);
      return argv[++i];
    };
    switch (a) {
      case "--plugin": opts.plugin = value(); break;
      case "--entry": opts.entry = value(); break;
      case "--wit": opts.wit = value(); break;
      case "--out": case "-o": opts.out = value(); break;
      case "--world": opts.world = value(); break;
      case "--sdk": opts.sdk = value(); break;
      case "--bundle-out": opts.bundleOut = value(); break;
      case "--minify": opts.minify = true; break;
      case "--disable": {
        const v = value();
        opts.disable =
          v === "none" ? [] : v === "all" ? [...FEATURES] : v.split(",").map((s) => s.trim()).filter(Boolean);
        for (const f of opts.disable) {
          if (!FEATURES.includes(f)) fail(`unknown feature \`${f}\` for --disable (${FEATURES.join(", ")})`);
        }
        break;
      }
      case "-h": case "--help": console.log(USAGE); process.exit(0);
      default: fail(`unknown argument \`${a}\`\n${USAGE}`);
    }
  }
  if (opts.plugin) {
    // A plugin directory: its package.json's "baton": {"entry", "sdk", "wit"}, relative to it.
    const manifest = join(opts.plugin, "package.json");
    if (!existsSync(manifest)) fail(`no package.json in ${opts.plugin}`);
    const pkg = JSON.parse(readFileSync(manifest, "utf8"));
    const b = pkg.baton ?? {};
    opts.entry ??= join(opts.plugin, b.entry ?? "processor.js");
    opts.wit ??= b.wit && join(opts.plugin, b.wit);
    if (b.sdk && opts.sdk === SDK) opts.sdk = join(opts.plugin, b.sdk);
    opts.out ??= join(opts.plugin, "target", `${pkg.name ?? basename(resolve(opts.plugin))}.wasm`);
  }
  for (const k of ["entry", "wit", "out"]) {
    if (!opts[k]) fail(`--${k} is required\n${USAGE}`);
  }
  return opts;
}

/** The directory the npm tools are installed in, checked. */
function toolsDir() {
  const root = process.env.BATON_JS_TOOLS || join(homedir(), ".cache", "baton", "js");
  const nm = join(root, "node_modules");
  const install =
    `install them with:\n  mkdir -p ${root} && cp ${join(SDK, "tools")}/package*.json ${root}/ && npm ci --prefix ${root}\n` +
    `(or set BATON_JS_TOOLS to a directory whose node_modules holds them)`;
  const need = {
    esbuild: "esbuild",
    componentize: "@bytecodealliance/componentize-js",
  };
  const found = {};
  for (const [k, pkg] of Object.entries(need)) {
    const manifest = join(nm, pkg, "package.json");
    if (!existsSync(manifest)) fail(`${pkg} is not installed in ${nm}; ${install}`);
    found[k] = { dir: join(nm, pkg), version: JSON.parse(readFileSync(manifest, "utf8")).version };
  }
  const wanted = JSON.parse(readFileSync(join(SDK, "tools", "package.json"), "utf8")).dependencies;
  for (const [k, pkg] of Object.entries(need)) {
    if (wanted[pkg] && wanted[pkg] !== found[k].version) {
      console.error(
        `baton js build: warning: ${pkg} ${found[k].version} in ${nm}, this SDK is tested with ${wanted[pkg]}`,
      );
    }
  }
  return { nm, ...found };
}

/** The ES module entry point of an installed package (its `exports` "import" or `main`). */
function esmEntry(dir) {
  const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  let e = pkg.exports;
  if (e && typeof e === "object" && "." in e) e = e["."];
  if (e && typeof e === "object") e = e.import ?? e.default;
  return join(dir, typeof e === "string" ? e : pkg.main ?? "index.js");
}

/** componentize-js 0.23 lowers a negative `s64` argument of an import (`timers.schedule`'s
 * `at`, `store.increment`'s `delta`) to a trap: its engine takes a core `i64` only as an
 * unsigned BigInt (ComponentizeJS#343), while the bindings it generates hand it a signed one.
 * The generated bindings' `toInt64` is made to produce the same 64 bits as unsigned; it is
 * used only for core `i64` arguments and for `setBigInt64` stores, which wrap either way. */
async function lowerS64Unsigned(dir) {
  const url = pathToFileURL(join(dir, "lib", "spidermonkey-embedding-splicer.js")).href;
  const { splicer } = await import(url);
  if (!splicer || typeof splicer.spliceBindings !== "function" || splicer.spliceBindings.batonPatched) return;
  const splice = splicer.spliceBindings;
  const signed = /(function toInt64\(val\)\s*\{\s*const converted = BigInt\(val\);?\s*return BigInt\.)asIntN(\(64, converted\);?\s*\})/;
  const patched = (...args) => {
    const r = splice(...args);
    if (r && typeof r.jsBindings === "string" && r.jsBindings.includes("function toInt64(")) {
      if (signed.test(r.jsBindings)) {
        r.jsBindings = r.jsBindings.replace(signed, "$1asUintN$2");
      } else {
        console.error(
          "baton js build: warning: the bindings' toInt64 is not the one this build knows; " +
            "a negative s64 argument to an import may trap",
        );
      }
    }
    return r;
  };
  patched.batonPatched = true;
  splicer.spliceBindings = patched;
}

function size(n) {
  return n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / 1024).toFixed(1)} KiB`;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const entry = resolve(opts.entry);
  const wit = resolve(opts.wit);
  const out = resolve(opts.out);
  const sdk = resolve(opts.sdk);
  if (!existsSync(entry)) fail(`no entry ${entry}`);
  if (!existsSync(wit)) fail(`no WIT at ${wit}`);
  if (!existsSync(join(sdk, "index.js"))) fail(`no baton-sdk (index.js) in ${sdk}`);
  const tools = toolsDir();

  // 1. One ES module: the entry, the SDK and what they import; baton:* stays external.
  const started = Date.now();
  const esbuild = createRequire(join(tools.nm, "noop.js"))("esbuild");
  let bundle;
  try {
    const r = await esbuild.build({
      entryPoints: [entry],
      bundle: true,
      format: "esm",
      platform: "neutral",
      target: "es2022",
      mainFields: ["module", "main"],
      external: ["baton:*"],
      alias: { "baton-sdk": sdk },
      minify: opts.minify,
      keepNames: true,
      write: false,
      logLevel: "silent",
    });
    bundle = r.outputFiles[0].text;
  } catch (e) {
    const errors = (e.errors ?? []).map((m) => {
      const l = m.location;
      return l ? `${l.file}:${l.line}:${l.column}: ${m.text}` : m.text;
    });
    fail(`bundling ${entry} failed:\n  ${errors.length ? errors.join("\n  ") : e.message}`);
  }
  if (!/export\s*\{[^}]*\bhandler\b[^}]*\}|export\s+(const|let|var|function)\s+handler\b/.test(bundle)) {
    fail(
      `${entry} does not export \`handler\`: add\n  export const handler = processor({ process(msg, ctx) { ... } });`,
    );
  }
  if (opts.bundleOut) await writeFile(resolve(opts.bundleOut), bundle);

  // 2. The component. componentize-js reads the module from a directory it maps into the engine,
  // so the bundle goes to a directory of its own (named like the entry, for stack traces).
  const work = await mkdtemp(join(tmpdir(), "baton-js-"));
  const source = join(work, basename(entry).replace(/\.(c|m)?(j|t)s$/, "") + ".js");
  await writeFile(source, bundle);
  let component;
  let error = null;
  try {
    const { componentize } = await import(pathToFileURL(esmEntry(tools.componentize.dir)).href);
    await lowerS64Unsigned(tools.componentize.dir);
    ({ component } = await componentize({
      sourcePath: source,
      witPath: wit,
      worldName: opts.world,
      disableFeatures: opts.disable,
    }));
  } catch (e) {
    error = e;
  }
  await rm(work, { recursive: true, force: true });
  if (error !== null) fail(`componentize-js failed: ${error && error.message ? error.message : error}`);
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, component);
  const secs = ((Date.now() - started) / 1000).toFixed(1);
  console.log(
    `${out}: ${size(statSync(out).size)} (${bundle.length} bytes of JS; componentize-js ${tools.componentize.version}, ` +
      `esbuild ${tools.esbuild.version}; without ${opts.disable.join(", ") || "nothing"}; ${secs} s)`,
  );
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e)));

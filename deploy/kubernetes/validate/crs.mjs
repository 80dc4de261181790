// Validates the third-party custom resources that check.py collected
// (cert-manager Issuer and Certificate, Prometheus Operator ServiceMonitor,
// KEDA ScaledObject) with the @kubernetes-models packages, which are
// generated from those projects' Go API types (the types their CRDs are
// generated from):
//   1. the package's JSON-schema validator (types, enums, required fields,
//      patterns), as `new Model(doc).validate()`;
//   2. the package's TypeScript declarations, through `tsc`: an object
//      literal typed as the resource must not have fields the type lacks, so
//      a misspelled or unknown field is an error, as with kubectl's strict
//      field validation (the JSON-schema validators let them through).
// Broken copies of each kind must fail the check that is meant to catch them.
//
//   node crs.mjs INPUT.json NODE_PREFIX      (validate.sh runs it)
// NODE_PREFIX holds node_modules with the packages of package.json.

import { readFileSync, writeFileSync, mkdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { spawnSync } from "node:child_process";

const input = process.argv[2];
const prefix = resolve(process.argv[3]);
const modules = join(prefix, "node_modules");

const KINDS = {
  "cert-manager.io/v1 Issuer": ["@kubernetes-models/cert-manager", "cert-manager.io/v1/Issuer", "Issuer", "IIssuer"],
  "cert-manager.io/v1 Certificate": ["@kubernetes-models/cert-manager", "cert-manager.io/v1/Certificate", "Certificate", "ICertificate"],
  "monitoring.coreos.com/v1 ServiceMonitor": ["@kubernetes-models/prometheus-operator", "monitoring.coreos.com/v1/ServiceMonitor", "ServiceMonitor", "IServiceMonitor"],
  "keda.sh/v1alpha1 ScaledObject": ["@kubernetes-models/keda", "keda.sh/v1alpha1/ScaledObject", "ScaledObject", "IScaledObject"],
};

function version(pkg) {
  return JSON.parse(readFileSync(join(modules, pkg, "package.json"), "utf8")).version;
}

let passed = 0;
const failures = [];
const ok = (what) => { passed++; console.log(`  ok    ${what}`); };
const fail = (what, why) => { failures.push(`${what}: ${why}`); console.log(`  FAIL  ${what}: ${why}`); };

// Each case: the document, and whether it must pass (expect = "valid"), or
// fail the schema ("schema") or the type check ("types").
const cases = JSON.parse(readFileSync(input, "utf8")).map((c) => ({ ...c, expect: "valid" }));
const seen = new Set(cases.map((c) => `${c.doc.apiVersion} ${c.doc.kind}`));
for (const k of Object.keys(KINDS)) {
  if (!seen.has(k)) fail(`manifests have a ${k}`, "none found; is the check list out of date?");
}

// Broken copies of the real documents.
const first = (kind) => structuredClone(cases.find((c) => c.doc.kind === kind && c.expect === "valid").doc);
const broken = [
  ["Issuer", "types", "spec.selfsigned (for selfSigned)", (d) => { d.spec = { selfsigned: {} }; }],
  ["Certificate", "schema", "spec.duration as a number", (d) => { d.spec.duration = 5; }],
  ["Certificate", "types", "spec.dnsName (for dnsNames)", (d) => { d.spec.dnsName = ["x"]; }],
  ["ServiceMonitor", "schema", "spec.endpoints as a string", (d) => { d.spec.endpoints = "admin"; }],
  ["ServiceMonitor", "types", "endpoints[0].intervall", (d) => { d.spec.endpoints[0].intervall = "5s"; }],
  ["ScaledObject", "schema", "spec.maxReplicaCount as a string", (d) => { d.spec.maxReplicaCount = "four"; }],
  ["ScaledObject", "schema", "no scaleTargetRef", (d) => { delete d.spec.scaleTargetRef; }],
  ["ScaledObject", "types", "triggers[0].metaData", (d) => { d.spec.triggers[0].metaData = {}; }],
];
for (const [kind, expect, label, mutate] of broken) {
  const doc = first(kind);
  mutate(doc);
  cases.push({ source: `negative: ${kind} with ${label}`, doc, expect });
}

const describe = (c) => `${c.source}: ${c.doc.kind}/${c.doc.metadata?.namespace ?? ""}/${c.doc.metadata?.name}`;

// 1. The JSON-schema validators.
const schemaFailed = new Map();
for (const [i, c] of cases.entries()) {
  const spec = KINDS[`${c.doc.apiVersion} ${c.doc.kind}`];
  if (!spec) {
    fail(describe(c), `no validator for ${c.doc.apiVersion} ${c.doc.kind}`);
    continue;
  }
  const [pkg, path, cls] = spec;
  const mod = await import(pathToFileURL(join(modules, pkg, `${path}.js`)).href);
  try {
    new mod[cls](structuredClone(c.doc)).validate();
  } catch (e) {
    schemaFailed.set(i, String(e.message ?? e).split("\n")[0]);
  }
}

// 2. The type check: one file per case, one tsc run for all.
const dir = join(prefix, "check");
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const files = [];
for (const [i, c] of cases.entries()) {
  const spec = KINDS[`${c.doc.apiVersion} ${c.doc.kind}`];
  if (!spec) continue;
  const [pkg, path, , iface] = spec;
  const file = join(dir, `case${i}.ts`);
  writeFileSync(file, `import type { ${iface} } from "${pkg}/${path}";\n` +
    `// ${c.source.replace(/\n/g, " ")}\nexport const doc: ${iface} = ${JSON.stringify(c.doc, null, 2)};\n`);
  files.push(file);
}
writeFileSync(join(prefix, "tsconfig.json"), JSON.stringify({
  compilerOptions: { strict: true, noEmit: true, module: "nodenext", moduleResolution: "nodenext",
    target: "es2022", skipLibCheck: true, types: [] },
  files,
}));
const tsc = spawnSync(process.execPath, [join(modules, "typescript/bin/tsc"), "-p", join(prefix, "tsconfig.json")],
  { encoding: "utf8" });
const typeFailed = new Map();
for (const line of (tsc.stdout + tsc.stderr).split("\n")) {
  const m = line.match(/case(\d+)\.ts\((\d+),\d+\): error (TS\d+: .*)/);
  if (m) {
    const i = Number(m[1]);
    typeFailed.set(i, [...(typeFailed.get(i) ?? []), `line ${m[2]} of check/case${i}.ts: ${m[3]}`]);
  } else if (/error TS/.test(line)) {
    fail("tsc", line);
  }
}

console.log(`third-party resources (${Object.values(KINDS).map((k) => k[0]).filter((v, i, a) => a.indexOf(v) === i)
  .map((p) => `${p}@${version(p)}`).join(", ")}, typescript@${version("typescript")})`);
for (const [i, c] of cases.entries()) {
  if (!KINDS[`${c.doc.apiVersion} ${c.doc.kind}`]) continue;
  const s = schemaFailed.get(i);
  const t = typeFailed.get(i);
  if (c.expect === "valid") {
    if (s || t) fail(describe(c), [s && `schema: ${s}`, t && `fields: ${t.join("; ")}`].filter(Boolean).join("; "));
    else ok(`${describe(c)} [schema, fields]`);
  } else if (c.expect === "schema") {
    if (s) ok(`${c.source} is refused by the schema`);
    else fail(`${c.source} is refused by the schema`, "accepted");
  } else {
    if (t) ok(`${c.source} is refused by the field check`);
    else fail(`${c.source} is refused by the field check`, "accepted");
  }
}
console.log(`crs.mjs: ${passed} passed, ${failures.length} failed`);
process.exit(failures.length ? 1 : 0);

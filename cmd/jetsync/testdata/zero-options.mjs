// Prints the option list of the @rocicorp/zero package at argv[2] as JSON,
// one object per option: env, flag, required, default, type, deprecated,
// hidden. It walks zero-cache's own option definitions (zeroOptions) and
// names each the way zero-cache's option parser does: groups one level deep,
// the flag in kebab case, the variable ZERO_ plus the flag in snake case.
// Used by TestZeroCacheOptionsCovered.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";
const pkg = process.argv[2];
const out = path.join(pkg, "out");
const imp = (p) => import(pathToFileURL(path.join(out, p)).href);
const { zeroOptions } = await imp("zero-cache/src/config/zero-config.js");
const { flagToEnv } = await imp("shared/src/options.js");
const { instanceOfAbstractType, testOptional } = await imp("shared/src/valita.js");
const require = createRequire(path.join(pkg, "package.json"));
const { toKebabCase } = await import(pathToFileURL(require.resolve("kasi")).href);
const rows = [];
function add(field, opt, group) {
  const { type, deprecated, hidden } = opt;
  const flag = toKebabCase(group ? `${group}-${field}` : field);
  const d = testOptional(undefined, type);
  const terms = new Set();
  let multiple = type.name === "array";
  const walk = (t) => {
    switch (t.name) {
      case "undefined": case "optional": break;
      case "array": multiple = true; t.prefix.forEach((x) => x.toTerminals(walk)); t.rest?.toTerminals(walk); t.suffix.forEach((x) => x.toTerminals(walk)); break;
      case "literal": terms.add(typeof t.value); break;
      default: terms.add(t.name);
    }
  };
  type.toTerminals(walk);
  rows.push({ env: flagToEnv("ZERO_", flag), flag, required: !d.ok, default: d.ok ? d.value : undefined, type: [...terms].join("|") + (multiple ? "[]" : ""), deprecated: deprecated !== undefined, hidden: hidden ?? deprecated !== undefined });
}
for (const [name, val] of Object.entries(zeroOptions)) {
  if (instanceOfAbstractType(val)) add(name, { type: val });
  else if (instanceOfAbstractType(val.type)) add(name, val);
  else for (const [n, o] of Object.entries(val)) add(n, instanceOfAbstractType(o) ? { type: o } : o, name);
}
process.stdout.write(JSON.stringify(rows));

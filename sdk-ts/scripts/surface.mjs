// Prints the SDK's public surface as JSON, read from the compiled declarations
// (dist/src/index.d.ts, @internal members stripped): for each exported class, each public
// member and its parameters. A parameter named `options` is an options object: its
// properties are listed instead (`exec(cmd, {timeoutSeconds})` -> ["cmd", "timeoutSeconds"]).
// tests/sdk/test_ts_parity.py compares this with the Python SDK's surface.
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const here = dirname(fileURLToPath(import.meta.url));
const entry = resolve(here, "../dist/src/index.d.ts");
const program = ts.createProgram([entry], { strict: true, skipLibCheck: true, types: ["node"],
  lib: ["lib.es2022.d.ts", "lib.esnext.disposable.d.ts", "lib.dom.d.ts"] });
const checker = program.getTypeChecker();
const module = checker.getSymbolAtLocation(program.getSourceFile(entry));

function isPublic(decl) {
  const flags = ts.getCombinedModifierFlags(decl);
  return !(flags & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected)) &&
    !(decl.name && ts.isPrivateIdentifier(decl.name)) &&
    !(decl.name && ts.isComputedPropertyName(decl.name));
}

function params(signature, at) {
  const names = [];
  for (const p of signature.getParameters()) {
    if (p.name !== "options") {
      names.push(p.name);
      continue;
    }
    const type = checker.getNonNullableType(checker.getTypeOfSymbolAtLocation(p, at));
    for (const prop of checker.getPropertiesOfType(type)) names.push(prop.name);
  }
  return names;
}

function members(cls, decl) {
  const out = {};
  const type = checker.getDeclaredTypeOfSymbol(cls);
  const sides = [[type, false], [checker.getTypeOfSymbolAtLocation(cls, decl), true]];
  for (const [side, isStatic] of sides) {
    for (const prop of checker.getPropertiesOfType(side)) {
      const d = prop.valueDeclaration ?? prop.declarations?.[0];
      if (!d || !isPublic(d) || prop.name === "prototype" || prop.name === "toString") continue;
      if (isStatic && !(ts.getCombinedModifierFlags(d) & ts.ModifierFlags.Static)) continue;
      const propType = checker.getTypeOfSymbolAtLocation(prop, d);
      const sigs = ts.isMethodDeclaration(d) || ts.isMethodSignature(d) ? propType.getCallSignatures() : [];
      // Overloads (files.read) list the union of their parameters.
      const names = new Set(sigs.flatMap((s) => params(s, d)));
      out[prop.name] = { kind: sigs.length ? "method" : "attribute", static: isStatic, params: [...names] };
    }
  }
  const ctor = checker.getTypeOfSymbolAtLocation(cls, decl).getConstructSignatures()
    .filter((s) => s.declaration && isPublic(s.declaration));
  if (ctor.length) out["constructor"] = { kind: "method", static: true, params: [...new Set(ctor.flatMap((s) => params(s, decl)))] };
  return out;
}

const classes = {};
const exports = [];
for (let sym of checker.getExportsOfModule(module)) {
  exports.push(sym.name);
  if (sym.flags & ts.SymbolFlags.Alias) sym = checker.getAliasedSymbol(sym);
  const decl = sym.declarations?.find((d) => ts.isClassDeclaration(d));
  if (decl) classes[sym.name] = members(sym, decl);
}
process.stdout.write(JSON.stringify({ classes, exports: exports.sort() }, null, 1) + "\n");

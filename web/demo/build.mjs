// Bundles the demo page into cmd/jetsync/demoweb, which jetsync embeds:
// node build.mjs (make does it). Everything is served by jetsync; no CDN.
import {build} from 'esbuild';
import {copyFileSync, mkdirSync} from 'node:fs';

const out = new URL('../../cmd/jetsync/demoweb/', import.meta.url).pathname;
mkdirSync(out, {recursive: true});
await build({
  entryPoints: ['src/main.ts'],
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: 'es2022',
  minify: true,
  legalComments: 'none',
  outfile: out + 'demo.js',
  logLevel: 'warning',
});
copyFileSync('index.html', out + 'index.html');
copyFileSync('demo.css', out + 'demo.css');

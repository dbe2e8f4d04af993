// The jetsync demo: a small issue tracker on the real @rocicorp/zero client,
// synced by jetsync. Plain DOM, no framework: each materialized view's
// listener re-renders its part of the page.
import {Zero} from '@rocicorp/zero';
import {mutators} from './mutators';
import {schema} from './schema';

// What the sync panel shows, and what the browser test reads
// (window.jetsyncDemo): the client's connection state, and what crossed the
// websocket, which the client does not expose otherwise.
type SyncState = {
  connection: string;
  clientID: string;
  clientGroupID: string;
  // baseCookie of each connection this page opened: a cookie on the first
  // one means the client started from its IndexedDB store, not from nothing.
  baseCookies: (string | null)[];
  pokes: number;
  lastPokeAt: number | null;
  rowsPatched: number;
  // Whether the issue list showed rows before the first poke arrived.
  rowsBeforeFirstPoke: boolean | null;
  listRows: number;
};

const state: SyncState = {
  connection: 'connecting',
  clientID: '',
  clientGroupID: '',
  baseCookies: [],
  pokes: 0,
  lastPokeAt: null,
  rowsPatched: 0,
  rowsBeforeFirstPoke: null,
  listRows: 0,
};
(window as any).jetsyncDemo = state;

// Zero looks the WebSocket global up for each connection, so a subclass here
// sees its frames.
const BaseWebSocket = window.WebSocket;
(window as any).WebSocket = class extends BaseWebSocket {
  constructor(url: string | URL, protocols?: string | string[]) {
    super(url, protocols);
    try {
      const u = new URL(String(url));
      if (u.pathname.includes('/sync/')) state.baseCookies.push(u.searchParams.get('baseCookie') || null);
    } catch {
      // not ours
    }
    this.addEventListener('message', (e: MessageEvent) => {
      let f: any;
      try {
        f = JSON.parse(String(e.data));
      } catch {
        return;
      }
      if (!Array.isArray(f)) return;
      if (f[0] === 'pokePart') state.rowsPatched += f[1]?.rowsPatch?.length ?? 0;
      if (f[0] === 'pokeEnd') {
        state.pokes++;
        state.lastPokeAt = Date.now();
        renderSync();
      }
    });
  }
};

const z = new Zero({
  schema,
  mutators,
  cacheURL: location.origin,
  userID: 'demo',
  kvStore: 'idb',
  logLevel: 'error',
} as any) as any;
state.clientID = z.clientID;
z.clientGroupID.then((id: string) => {
  state.clientGroupID = id;
  renderSync();
});
z.connection.state.subscribe((s: any) => {
  state.connection = s.name;
  renderSync();
});

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const el = (tag: string, attrs: Record<string, string> = {}, ...kids: (Node | string)[]) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.append(...kids);
  return e;
};
const newID = () => Math.random().toString(36).slice(2, 10);
const fmtTime = (ms: number) => new Date(ms).toLocaleString();

// The issue list: filter, sort and "show closed" pick the query; a new
// query replaces the old view.
let listView: any;
let selected: string | null = null;

function listQuery() {
  const text = $<HTMLInputElement>('filter').value.trim();
  const [col, dir] = $<HTMLSelectElement>('sort').value.split(':');
  let q = z.query.issue.related('owner').related('labels');
  if (!$<HTMLInputElement>('closed').checked) q = q.where('open', true);
  if (text) q = q.where('title', 'ILIKE', `%${text}%`);
  return q.orderBy(col, dir).orderBy('id', 'asc').limit(200);
}

function renderList(issues: readonly any[]) {
  state.listRows = issues.length;
  if (state.rowsBeforeFirstPoke === null && issues.length > 0) state.rowsBeforeFirstPoke = state.pokes === 0;
  const ul = $('issues');
  ul.replaceChildren(
    ...issues.map(i =>
      el(
        'li',
        {'data-id': i.id, class: (i.open ? 'open' : 'closed') + (i.id === selected ? ' selected' : '')},
        el('span', {class: 'title'}, i.title),
        el('span', {class: 'meta'}, `${i.owner?.name ?? 'nobody'} · ${i.open ? 'open' : 'closed'}`),
        ...i.labels.map((l: any) => el('span', {class: 'label'}, l.name)),
      ),
    ),
  );
  $('count').textContent = `${issues.length} issue${issues.length === 1 ? '' : 's'}`;
  renderSync();
}

function refreshList() {
  listView?.destroy();
  listView = z.materialize(listQuery());
  listView.addListener((data: readonly any[]) => renderList(data));
}

// The selected issue, with its comments and labels.
let detailView: any;

function select(id: string | null) {
  selected = id;
  detailView?.destroy();
  detailView = undefined;
  for (const li of $('issues').querySelectorAll('li')) li.classList.toggle('selected', li.getAttribute('data-id') === id);
  if (!id) {
    $('detail').hidden = true;
    return;
  }
  $('detail').hidden = false;
  detailView = z.materialize(
    z.query.issue
      .where('id', id)
      .related('owner')
      .related('labels')
      .related('comments', (q: any) => q.orderBy('created', 'asc').orderBy('id', 'asc'))
      .one(),
  );
  let shownFor = '';
  detailView.addListener((i: any) => {
    if (!i) {
      $('detail-title').textContent = '(gone)';
      return;
    }
    $('detail-title').textContent = i.title;
    // Keep what the user is typing; refill when another issue is shown.
    if (shownFor !== i.id) $<HTMLInputElement>('edit-title').value = i.title;
    shownFor = i.id;
    $('detail-meta').textContent =
      `${i.id} · ${i.owner?.name ?? 'nobody'} · ${i.open ? 'open' : 'closed'} · created ${fmtTime(i.created)}`;
    $('detail-labels').replaceChildren(...i.labels.map((l: any) => el('span', {class: 'label'}, l.name)));
    $('toggle-open').textContent = i.open ? 'Close issue' : 'Reopen issue';
    $('toggle-open').dataset.open = String(i.open);
    $('comments').replaceChildren(
      ...i.comments.map((c: any) =>
        el('li', {'data-id': c.id}, el('span', {class: 'meta'}, fmtTime(c.created)), ' ', c.body),
      ),
    );
  });
}

function renderSync() {
  const ago = state.lastPokeAt ? `${((Date.now() - state.lastPokeAt) / 1000).toFixed(1)} s ago` : 'none yet';
  const rows: [string, string][] = [
    ['connection', state.connection],
    ['client', state.clientID],
    ['client group', state.clientGroupID],
    ['started from', state.baseCookies[0] ? `IndexedDB (cookie ${state.baseCookies[0]})` : 'nothing (first sync)'],
    ['pokes', String(state.pokes)],
    ['last poke', ago],
    ['rows patched', String(state.rowsPatched)],
    ['rows in list', String(state.listRows)],
  ];
  const dl = $('sync');
  dl.replaceChildren(...rows.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {'data-key': k}, v)]));
  dl.dataset.connection = state.connection;
}
setInterval(renderSync, 1000);

// Wiring.
for (const id of ['filter', 'sort', 'closed']) $(id).addEventListener('input', refreshList);
$('issues').addEventListener('click', e => {
  const li = (e.target as HTMLElement).closest('li');
  if (li) select(li.getAttribute('data-id'));
});
$('create').addEventListener('submit', e => {
  e.preventDefault();
  const title = $<HTMLInputElement>('new-title').value.trim();
  if (!title) return;
  const now = Date.now();
  const id = 'i-' + newID();
  z.mutate(mutators.issue.create({id, title, owner_id: $<HTMLSelectElement>('new-owner').value || null, created: now, modified: now}));
  $<HTMLInputElement>('new-title').value = '';
  select(id);
});
$('edit').addEventListener('submit', e => {
  e.preventDefault();
  const title = $<HTMLInputElement>('edit-title').value.trim();
  if (selected && title) z.mutate(mutators.issue.update({id: selected, title, modified: Date.now()}));
});
$('toggle-open').addEventListener('click', () => {
  if (!selected) return;
  const open = $('toggle-open').dataset.open !== 'true';
  z.mutate(mutators.issue.setOpen({id: selected, open, modified: Date.now()}));
});
$('comment').addEventListener('submit', e => {
  e.preventDefault();
  const body = $<HTMLInputElement>('comment-body').value.trim();
  if (!selected || !body) return;
  z.mutate(mutators.comment.add({id: 'c-' + newID(), issue_id: selected, body, created: Date.now()}));
  $<HTMLInputElement>('comment-body').value = '';
});

// The owner picker follows the user table.
z.materialize(z.query.user.orderBy('name', 'asc')).addListener((users: readonly any[]) => {
  const sel = $<HTMLSelectElement>('new-owner');
  const keep = sel.value;
  sel.replaceChildren(el('option', {value: ''}, 'nobody'), ...users.map(u => el('option', {value: u.id}, u.name)));
  sel.value = keep;
});

refreshList();
renderSync();

/**
 * Op fallbacks: the ops that ran on the host instead of the device, newest first, each with
 * the user's line and that line's source text (the answer to "which line of mine?"). A
 * notebook line reads `Cell In[N], line M` and is a link: `reveal` scrolls to that cell.
 */
import { ICellLocation, IFallbackRow, parseCellLocation } from '../protocol';
import { count, location } from './format';
import { h, section } from './dom';

/** Scroll the notebook to a cell: by its id when the kernel told us, else by `In[N]`. */
export type RevealCell = (where: ICellLocation, cellId: string | null) => void;

export function renderFallbacks(
  rows: IFallbackRow[],
  reveal: RevealCell | null = null,
  cellIds: Record<string, string> = {}
): HTMLElement {
  if (!rows.length) {
    return section('fallbacks', 'Op fallbacks', h('p', { class: 'jp-NeuronLab-empty' }, 'none — every op ran on the device'));
  }
  const total = rows.reduce((a, r) => a + r.count, 0);
  return section(
    'fallbacks',
    `Op fallbacks (${rows.length} ops, ${count(total)} calls)`,
    h(
      'table',
      { class: 'jp-NeuronLab-table' },
      h('thead', null, h('tr', null, h('th', null, 'op · reason · where'), h('th', { class: 'jp-mod-num jp-NeuronLab-countCol' }, 'count'))),
      h('tbody', null, ...rows.flatMap(r => renderRow(r, reveal, cellIds)))
    )
  );
}

/** A location as text, or as a link to its cell when it is one and the panel can reveal it. */
export function renderLocation(
  loc: string,
  suffix: string,
  reveal: RevealCell | null,
  cellIds: Record<string, string>
): HTMLElement {
  const cell = parseCellLocation(loc);
  if (!cell || !reveal) {
    return h('code', { class: 'jp-NeuronLab-loc', data: { nl: 'location' } }, location(loc) + suffix);
  }
  const id = cellIds[String(cell.n)] ?? null;
  const link = h(
    'a',
    {
      class: 'jp-NeuronLab-cellLink',
      title: `Scroll to cell In[${cell.n}], line ${cell.line}`,
      data: { nl: 'location', cell: id ?? '', n: cell.n, line: cell.line },
      attrs: { href: '#', role: 'link' },
      onclick: (ev: Event) => {
        ev.preventDefault();
        reveal(cell, id);
      }
    },
    loc
  );
  return h('span', { class: 'jp-NeuronLab-loc' }, link, suffix);
}

function renderRow(r: IFallbackRow, reveal: RevealCell | null, cellIds: Record<string, string>): HTMLElement[] {
  const where = r.locations ?? [];
  const first = where[0];
  const src = first ? r.source?.[first] : undefined;
  const more = where.length > 1 ? ` (+${where.length - 1} more)` : '';
  const main = h(
    'tr',
    { class: 'jp-NeuronLab-fallback', data: { nl: 'fallback-row', op: r.op } },
    h('td', { class: 'jp-NeuronLab-op', title: r.op }, r.op),
    h('td', { class: 'jp-mod-num' }, count(r.count))
  );
  const loc = h(
    'tr',
    { class: 'jp-NeuronLab-fallbackWhere' },
    h(
      'td',
      { attrs: { colspan: '2' }, title: where.join('\n') },
      h('div', { class: 'jp-NeuronLab-reason', data: { nl: 'reason' } }, r.reason),
      first ? renderLocation(first, more, reveal, cellIds) : 'location unknown',
      src ? h('code', { class: 'jp-NeuronLab-src', data: { nl: 'source' } }, src.trim()) : null
    )
  );
  return [main, loc];
}

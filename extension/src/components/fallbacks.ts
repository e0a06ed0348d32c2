/**
 * Op fallbacks: the ops that ran on the host instead of the device, newest first, each with
 * the user's `file:line` and that line's source text (the answer to "which line of mine?").
 */
import { IFallbackRow } from '../protocol';
import { count, location } from './format';
import { h, section } from './dom';

export function renderFallbacks(rows: IFallbackRow[]): HTMLElement {
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
      h('tbody', null, ...rows.flatMap(renderRow))
    )
  );
}

function renderRow(r: IFallbackRow): HTMLElement[] {
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
      first ? h('code', { class: 'jp-NeuronLab-loc', data: { nl: 'location' } }, location(first) + more) : 'location unknown',
      src ? h('code', { class: 'jp-NeuronLab-src', data: { nl: 'source' } }, src.trim()) : null
    )
  );
  return [main, loc];
}

/**
 * Timing: the running cell live (elapsed, ops/s, launches, fused share, compile queue) and the
 * last cells' records (wall, device time, ops, fallbacks, peak memory), newest first.
 */
import { ICellRecord, IRunning } from '../protocol';
import { bytes, count, pct, seconds } from './format';
import { h, section, stats } from './dom';

export function renderRunning(r: IRunning | null): HTMLElement {
  const busy = !!r?.cell_id;
  const title = busy ? 'Running cell' : 'Running cell — idle';
  return section(
    'running',
    title,
    stats([
      ['elapsed', 'elapsed', busy ? seconds(r!.elapsed_s) : '–'],
      ['ops-per-s', 'ops/s', busy ? count(r!.ops_per_s) : '–'],
      ['ops', 'ops', busy ? count(r!.ops) : '–'],
      ['launches', 'launches', busy ? count(r!.launches) : '–'],
      ['fused-share', 'fused share', busy ? pct(r!.fused_share) : '–'],
      ['compile-queue', 'compile queue', count(r?.compile_queue ?? 0)]
    ])
  );
}

export function renderCells(cells: ICellRecord[]): HTMLElement {
  if (!cells.length) {
    return section('cells', 'Last cells', h('p', { class: 'jp-NeuronLab-empty' }, 'no cell has finished since neuron_lab loaded'));
  }
  const th = (t: string, tip: string) => h('th', { class: 'jp-mod-num', title: tip }, t);
  return section(
    'cells',
    'Last cells',
    h(
      'table',
      { class: 'jp-NeuronLab-table' },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          h('th', { title: 'cell number since %load_ext' }, '#'),
          th('wall', 'wall-clock time'),
          th('device', 'time in device launches'),
          th('ops', 'ops executed'),
          th('fb', 'fallbacks'),
          th('peak', 'peak allocated memory')
        )
      ),
      h(
        'tbody',
        null,
        ...cells.map(c =>
          h(
            'tr',
            { data: { nl: 'cell-row' }, title: `launches ${c.launches}, fused ${pct(c.fused_share)}, compiles ${c.compiles}` },
            h('td', null, c.index ?? ''),
            h('td', { class: 'jp-mod-num' }, seconds(c.wall_s)),
            h('td', { class: 'jp-mod-num' }, seconds(c.device_s)),
            h('td', { class: 'jp-mod-num' }, count(c.ops)),
            h('td', { class: `jp-mod-num${c.fallbacks ? ' jp-mod-warn' : ''}` }, count(c.fallbacks)),
            h('td', { class: 'jp-mod-num' }, bytes(c.peak_bytes))
          )
        )
      )
    )
  );
}

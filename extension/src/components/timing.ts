/**
 * Timing: the running cell live (elapsed, ops/s, launches, fused share, compile queue) and the
 * last cells' records (wall, host time in launches, modelled trn2 time, ops, fallbacks, peak memory), newest first.
 */
import { ICellRecord, IRunning } from '../protocol';
import { bytes, count, pct, seconds } from './format';
import { h, section, stats } from './dom';

export function renderRunning(r: IRunning | null): HTMLElement {
  const queue: [string, string, string] = ['compile-queue', 'compile queue', count(r?.compile_queue ?? 0)];
  if (!r?.cell_id) {
    return section('running', 'Running cell', h('p', { class: 'jp-NeuronLab-empty' }, 'idle'), stats([queue]));
  }
  return section(
    'running',
    'Running cell',
    stats([
      ['elapsed', 'elapsed', seconds(r.elapsed_s)],
      ['ops-per-s', 'ops/s', count(r.ops_per_s)],
      ['ops', 'ops', count(r.ops)],
      ['launches', 'launches', count(r.launches)],
      ['fused-share', 'fused share', pct(r.fused_share)],
      queue
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
      { class: 'jp-NeuronLab-table jp-NeuronLab-cells' },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          h('th', { title: 'In[N]: the execution count (else the cell number since %load_ext)' }, '#'),
          th('wall', 'wall-clock time'),
          th('host', 'host seconds spent in device launches (the emulator)'),
          th('trn2', 'modelled Trainium2 time of the recorded launches: a model (roofline + launch overhead), not a measurement; — when no launch was priced (eager mode)'),
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
            h('td', null, c.execution_count ?? c.index ?? ''),
            h('td', { class: 'jp-mod-num' }, seconds(c.wall_s)),
            h('td', { class: 'jp-mod-num' }, seconds(c.device_s)),
            h(
              'td',
              { class: 'jp-mod-num', data: { nl: 'modelled' }, title: `${c.modelled_ops ?? 0} ops priced` },
              c.modelled_s === null || c.modelled_s === undefined ? '—' : seconds(c.modelled_s)
            ),
            h('td', { class: 'jp-mod-num' }, count(c.ops)),
            h('td', { class: `jp-mod-num${c.fallbacks ? ' jp-mod-warn' : ''}` }, count(c.fallbacks)),
            h('td', { class: 'jp-mod-num' }, bytes(c.peak_bytes))
          )
        )
      )
    )
  );
}

/** Region cache of the adaptive runtime: cached regions, hit rate, compiles pending / failed. */
import { IRegions } from '../protocol';
import { count, pct } from './format';
import { h, section, stats } from './dom';

export function renderRegions(r: IRegions | null, mode: string | undefined): HTMLElement {
  if (!r) {
    return section('regions', 'Region cache', h('p', { class: 'jp-NeuronLab-empty' }, 'no data yet'));
  }
  return section(
    'regions',
    mode === 'eager' ? 'Region cache (mode: eager, not used)' : 'Region cache',
    stats([
      ['regions', 'regions', count(r.count)],
      ['hit-rate', 'hit rate', pct(r.hit_rate), `${r.hits} hits, ${r.misses} misses`],
      ['fused', 'fused share', pct(r.fused_share)],
      ['compiles-pending', 'compiles pending', count(r.compiles_pending)],
      ['compiles-failed', 'compiles failed', count(r.compiles_failed)]
    ])
  );
}

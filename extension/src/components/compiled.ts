/**
 * "Compiled graphs": torch.compile on neuron (`neuron_lab.metrics()["torch_compile"]`). Totals —
 * frames, programs, recompiles, graph breaks, failures, compile time — and the latest
 * recompiles with the guard that failed, graph breaks with their reason and compile failures
 * with what ran instead, each at the user's line (a link to the cell in a notebook). Shown only
 * once something was compiled.
 */
import { ICompiled } from '../protocol';
import { count, seconds } from './format';
import { h, section, stats } from './dom';
import { renderLocation, RevealCell } from './fallbacks';

export function renderCompiled(
  compiled: ICompiled | null,
  reveal: RevealCell | null = null,
  cellIds: Record<string, string> = {}
): HTMLElement | null {
  if (!compiled || (!compiled.frames && !compiled.programs && !compiled.rows.length)) {
    return null;
  }
  return section(
    'compiled',
    'Compiled graphs (torch.compile)',
    stats([
      ['frames', 'frames', count(compiled.frames)],
      ['programs', 'programs', count(compiled.programs)],
      ['recompiles', 'recompiles', count(compiled.recompiles)],
      ['graph-breaks', 'graph breaks', count(compiled.graph_breaks)],
      ['failures', 'failures', count(compiled.failures), 'frames that fell back to eager'],
      ['compile-s', 'compile time', seconds(compiled.compile_s)]
    ]),
    compiled.rows.length
      ? h(
          'ul',
          { class: 'jp-NeuronLab-compiled' },
          ...compiled.rows.map(r =>
            h(
              'li',
              { data: { nl: 'compiled-row', kind: r.kind } },
              h('span', { class: 'jp-NeuronLab-kind' }, r.count > 1 ? `${r.kind} ×${r.count}` : r.kind),
              renderLocation(r.location, '', reveal, cellIds),
              h('div', { class: 'jp-NeuronLab-message', data: { nl: 'detail' } }, r.detail)
            )
          )
        )
      : null
  );
}

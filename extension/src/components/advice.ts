/**
 * The advisor's findings (`neuron_lab.advise()`), ranked by their modelled trn2 cost: what to
 * change, where (a link to the cell in a notebook), and what it costs on the modelled chip.
 */
import { IFinding } from '../protocol';
import { seconds } from './format';
import { h, section } from './dom';
import { renderLocation, RevealCell } from './fallbacks';

export function renderAdvice(
  findings: IFinding[],
  reveal: RevealCell | null = null,
  cellIds: Record<string, string> = {}
): HTMLElement {
  if (!findings.length) {
    return section('advice', 'Advice', h('p', { class: 'jp-NeuronLab-empty' }, 'nothing to advise yet'));
  }
  return section(
    'advice',
    'Advice (ranked by modelled trn2 cost)',
    h(
      'ol',
      { class: 'jp-NeuronLab-advice' },
      ...findings.map(f =>
        h(
          'li',
          { data: { nl: 'finding', kind: f.kind }, title: f.fix },
          h(
            'div',
            { class: 'jp-NeuronLab-findingHead' },
            h('span', { class: 'jp-NeuronLab-kind' }, f.kind),
            h('span', { class: 'jp-NeuronLab-cost', title: 'modelled trn2 time it costs (a model)' }, f.modelled_s ? seconds(f.modelled_s) : '')
          ),
          f.where ? renderLocation(f.where, '', reveal, cellIds) : null,
          h('div', { class: 'jp-NeuronLab-message', data: { nl: 'message' } }, f.message),
          h('div', { class: 'jp-NeuronLab-fix', data: { nl: 'fix' } }, `Fix: ${f.fix}`)
        )
      )
    )
  );
}

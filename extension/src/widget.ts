/**
 * Rendering only: turns one `IState` (plus the notebook's label) into the panel's DOM.
 *
 * No kernel, comm or signal in here; `panel.ts` decides when to call it (coalesced to one
 * render per animation frame by Lumino's update requests) and supplies the actions.
 */
import { renderAdvice } from './components/advice';
import { renderCompiled } from './components/compiled';
import { renderFallbacks, RevealCell } from './components/fallbacks';
import { renderMemory } from './components/memory';
import { renderRegions } from './components/regions';
import { IHeaderActions, INotLoadedActions, renderHeader, renderPlaceholder } from './components/status';
import { renderCells, renderRunning } from './components/timing';
import { h } from './components/dom';
import { emptyState, IState } from './state';

export interface IViewActions extends IHeaderActions, INotLoadedActions {
  /** scroll the notebook to a `Cell In[N], line M` location (absent: locations are plain text) */
  reveal?: RevealCell;
}

export function renderPanel(state: IState | null, label: string, actions: IViewActions): HTMLElement {
  const st = state ?? emptyState();
  const header = renderHeader(st, label, actions);
  const placeholder = renderPlaceholder(st, state !== null, actions);
  if (placeholder) {
    return h('div', { class: 'jp-NeuronLab-content', data: { nl: 'content', status: st.status } }, header, placeholder);
  }
  return h(
    'div',
    { class: 'jp-NeuronLab-content', data: { nl: 'content', status: st.status } },
    header,
    renderMemory(st.memory, st.timeline),
    renderRunning(st.running),
    renderFallbacks(st.fallbacks, actions.reveal ?? null, st.cellIds),
    renderAdvice(st.advice ?? [], actions.reveal ?? null, st.cellIds),
    renderCells(st.cells),
    renderRegions(st.regions, st.hello?.mode),
    renderCompiled(st.compiled, actions.reveal ?? null, st.cellIds)
  );
}

/**
 * The side panel's lifecycle: one widget in the right sidebar, restored on reload, showing
 * whatever model the tracker says is current.
 *
 * It listens to two things only: the tracker's `currentChanged` (the user switched or
 * closed a notebook) and the current model's `stateChanged` (a message arrived or the
 * connection changed). Both just request an update; Lumino coalesces update requests into
 * one render per animation frame, so a burst of pushes costs one redraw.
 */
import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ICellLocation } from './protocol';
import { neuronIcon } from './icon';
import { NeuronModel } from './model';
import { ICurrent, KernelTracker } from './tracker';
import { renderPanel } from './widget';

export const PANEL_ID = 'neuron-lab-panel';
export const PANEL_RANK = 900;

export class NeuronPanel extends Widget {
  constructor(tracker: KernelTracker, activate: (id: string) => void = () => {}) {
    super();
    this._activate = activate;
    this.id = PANEL_ID;
    this.addClass('jp-NeuronLab');
    this.title.icon = neuronIcon;
    this.title.caption = 'neuron device: memory, fallbacks, timing';
    this._tracker = tracker;
    tracker.currentChanged.connect(this._onCurrent, this);
    this._onCurrent(tracker, tracker.current);
  }

  get model(): NeuronModel | null {
    return this._model;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._tracker.currentChanged.disconnect(this._onCurrent, this);
    this._model?.stateChanged.disconnect(this._onState, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this.update();
  }

  protected onUpdateRequest(msg: Message): void {
    if (!this.isVisible) {
      return; // collapsed sidebar: nothing to draw; onAfterShow redraws
    }
    const model = this._model;
    const view = renderPanel(model ? model.state : null, this._label, {
      load: () => void model?.loadExtension(),
      refresh: () => model?.refresh(),
      reveal: (where, cellId) => this._reveal(where, cellId)
    });
    this.node.replaceChildren(view);
  }

  private _onCurrent(_: KernelTracker, current: ICurrent): void {
    if (current.model !== this._model) {
      this._model?.stateChanged.disconnect(this._onState, this);
      this._model = current.model;
      this._model?.stateChanged.connect(this._onState, this);
    }
    this._label = current.label;
    this._notebook = current.notebook;
    this.update();
  }

  /**
   * Scroll the current notebook to a `Cell In[N], line M` location and put the cursor on the
   * line: the cell with the id the kernel recorded for In[N], else the one whose prompt shows
   * [N] (the user re-ran nothing since). Returns the cell's index, or -1 when it is gone.
   */
  private _reveal(where: ICellLocation, cellId: string | null): number {
    const nb = this._notebook;
    if (!nb || nb.isDisposed) {
      return -1;
    }
    const cells = nb.content.widgets;
    let index = cellId ? cells.findIndex(c => c.model.id === cellId) : -1;
    if (index < 0) {
      index = cells.findIndex(c => (c.model as { executionCount?: number | null }).executionCount === where.n);
    }
    if (index < 0) {
      return -1;
    }
    this._activate(nb.id);
    nb.content.activeCellIndex = index;
    const cell = cells[index];
    void nb.content.scrollToCell(cell, 'center');
    cell.editor?.setCursorPosition({ line: Math.max(0, where.line - 1), column: 0 });
    return index;
  }

  private _onState(): void {
    this.update();
  }

  private _tracker: KernelTracker;
  private _model: NeuronModel | null = null;
  private _label = '';
  private _notebook: NotebookPanel | null = null;
  private _activate: (id: string) => void;
}

/** Put the panel into the right sidebar and register it with the layout restorer. */
export function addPanel(app: JupyterFrontEnd, tracker: KernelTracker, restorer: ILayoutRestorer | null): NeuronPanel {
  const panel = new NeuronPanel(tracker, id => app.shell.activateById(id));
  app.shell.add(panel, 'right', { rank: PANEL_RANK });
  if (restorer) {
    restorer.add(panel, PANEL_ID);
  }
  return panel;
}

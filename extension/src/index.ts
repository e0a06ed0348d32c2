/**
 * Plugin entry: wires the notebook tracker, the side panel, the settings and the commands.
 *
 * Everything else lives by role: `tracker.ts` follows the current notebook's kernel,
 * `model.ts` owns the comm, `panel.ts` the widget's lifecycle, `widget.ts` and
 * `components/` the rendering, `protocol.ts` the message types.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { addPanel, PANEL_ID } from './panel';
import { DEFAULT_PUSH_HZ } from './protocol';
import { KernelTracker } from './tracker';

export const PLUGIN_ID = 'neuron-lab-panel:plugin';

export namespace CommandIDs {
  export const open = 'neuron-lab:open-panel';
  export const load = 'neuron-lab:load-extension';
  export const refresh = 'neuron-lab:refresh';
}

export interface ISettings {
  refreshRate: number;
  timelineLength: number;
  cellsShown: number;
}

export function readSettings(s: ISettingRegistry.ISettings | null): ISettings {
  const get = <T>(k: string, d: T): T => (s ? ((s.composite[k] as T | undefined) ?? d) : d);
  return {
    refreshRate: get('refreshRate', DEFAULT_PUSH_HZ),
    timelineLength: get('timelineLength', 120),
    cellsShown: get('cellsShown', 10)
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Side panel: live neuron device memory, op fallbacks and timing of the current notebook kernel.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILayoutRestorer, ISettingRegistry, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    restorer: ILayoutRestorer | null,
    registry: ISettingRegistry | null,
    palette: ICommandPalette | null
  ) => {
    const initial = readSettings(null);
    const tracker = new KernelTracker(notebooks, {
      rateHz: initial.refreshRate,
      limits: { timeline: initial.timelineLength, cells: initial.cellsShown }
    });
    addPanel(app, tracker, restorer);

    if (registry) {
      const apply = (s: ISettingRegistry.ISettings) => {
        const v = readSettings(s);
        tracker.setLimits({ timeline: v.timelineLength, cells: v.cellsShown });
        tracker.setRate(v.refreshRate);
      };
      registry
        .load(PLUGIN_ID)
        .then(s => {
          apply(s);
          s.changed.connect(apply);
        })
        .catch(reason => console.error(`neuron-lab-panel: could not load settings: ${reason}`));
    }

    const model = () => tracker.current.model;
    app.commands.addCommand(CommandIDs.open, {
      label: 'Show the neuron device panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.load, {
      label: 'Load neuron_lab in the current kernel (%load_ext neuron_lab)',
      isEnabled: () => !!model()?.kernel,
      execute: () => model()?.loadExtension()
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh the neuron device panel',
      isEnabled: () => model()?.state.status === 'live',
      execute: () => model()?.refresh()
    });
    if (palette) {
      const category = 'neuron_lab';
      [CommandIDs.open, CommandIDs.load, CommandIDs.refresh].forEach(command => palette.addItem({ command, category }));
    }
  }
};

export default plugin;

/** The panel's sidebar icon: a chip. Drawn with `jp-icon3` so it follows the theme. */
import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M9 2h2v3H9zM13 2h2v3h-2zM9 19h2v3H9zM13 19h2v3h-2zM2 9h3v2H2zM2 13h3v2H2zM19 9h3v2h-3zM19 13h3v2h-3z"/>
    <path d="M6 5h12a1 1 0 0 1 1 1v12a1 1 0 0 1-1 1H6a1 1 0 0 1-1-1V6a1 1 0 0 1 1-1zm1 2v10h10V7z"/>
    <path d="M9 9h6v6H9z"/>
  </g>
</svg>`;

export const neuronIcon = new LabIcon({ name: 'neuron-lab-panel:chip', svgstr: svg });

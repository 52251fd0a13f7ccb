// Cells nbtool tags "solution" (reference solutions) and "install" (the Colab install cell)
// start collapsed, as on Colab, each under a summary line saying what it holds.
const COLLAPSED = { solution: "Reference solution", install: "Install cell (runs on Colab only)" };

function collapseTaggedCells() {
  for (const [tag, summary] of Object.entries(COLLAPSED)) {
    document.querySelectorAll(`.jp-Cell.celltag_${tag}`).forEach((cell) => {
      // nbconvert nests two .jp-Cell divs per code cell: wrap the outer one, once
      if (cell.parentElement.closest(`.celltag_${tag}, details.${tag}`)) return;
      const details = document.createElement("details");
      details.className = tag;
      details.innerHTML = `<summary>${summary}</summary>`;
      cell.replaceWith(details);
      details.appendChild(cell);
    });
  }
}
if (typeof document$ !== "undefined") document$.subscribe(collapseTaggedCells);
else document.addEventListener("DOMContentLoaded", collapseTaggedCells);

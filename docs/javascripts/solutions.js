// Reference solutions (notebook cells tagged "solution") start collapsed, as on Colab.
function collapseSolutions() {
  document.querySelectorAll(".jp-Cell.celltag_solution").forEach((cell) => {
    // nbconvert nests two .jp-Cell divs per code cell: wrap the outer one, once
    if (cell.parentElement.closest(".celltag_solution, details.solution")) return;
    const details = document.createElement("details");
    details.className = "solution";
    details.innerHTML = "<summary>Reference solution</summary>";
    cell.replaceWith(details);
    details.appendChild(cell);
  });
}
if (typeof document$ !== "undefined") document$.subscribe(collapseSolutions);
else document.addEventListener("DOMContentLoaded", collapseSolutions);

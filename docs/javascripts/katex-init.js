// Typeset the maths that pymdownx.arithmatex (generic mode) wraps as \( ... \) and \[ ... \],
// with the KaTeX copy vendored beside this file (no CDN: the site renders offline).
// mkdocs-material's document$ fires on every page load, instant navigation included.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: false,
  });
});

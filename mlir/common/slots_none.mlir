  // normir common piece: the ${NAME} column sums' slots need no functions (registers, or [k][tid]
  // slots read and written in place).
